"""Trackers on 2 ranks. Phase `first`: train 6 steps logging each, profile one step, save_state,
then end_training with a tracker that raises in finish. Phase `resume` (a fresh launch): load the
checkpoint, train 4 more steps logging each, end_training.

Trackers: TensorBoard (main process only), `recorder` (a GeneralTracker registered by name, main
process only) and `every_rank` (main_process_only=False). The recorders append one JSON line per
call to <out>/<name>.rank<r>.jsonl; each rank writes what it saw to <out>/result.<phase>.rank<r>.json.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

from accelerando import Accelerator, ProfileKwargs
from accelerando.tracking import GeneralTracker, TrackerError, register_tracker_class
from accelerando.tracking.base import INERT_RUN

phase, out = sys.argv[1], Path(sys.argv[2])


class Recorder(GeneralTracker):
    name = "recorder"
    requires_logging_directory = True

    def __init__(self, run_name: str, logging_dir: str) -> None:
        super().__init__()
        self.path = Path(logging_dir) / f"{self.name}.rank{int(os.environ['RANK'])}.jsonl"

    @property
    def tracker(self) -> Path:
        return self.path

    def _write(self, record: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")

    def store_init_configuration(self, values: dict) -> None:
        self._write({"phase": phase, "config": values})

    def log(self, values: dict, step: int | None = None, **kwargs) -> None:
        self._write({"phase": phase, "step": step, "values": values})


class EveryRank(Recorder):
    name = "every_rank"
    requires_logging_directory = False
    main_process_only = False

    def __init__(self, logging_dir: str) -> None:
        super().__init__("unused", logging_dir)


class FailsAtFinish(GeneralTracker):
    name = "fails_at_finish"
    requires_logging_directory = False
    tracker = None

    def finish(self) -> None:
        raise ConnectionError("upload refused")


register_tracker_class(Recorder)
trackers = ["tensorboard", "recorder", EveryRank(str(out))] + ([FailsAtFinish()] if phase == "first" else [])
acc = Accelerator(cpu=True, log_with=trackers, project_dir=str(out))
rank = acc.process_index
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model, opt = acc.prepare(model, opt)
acc.init_trackers("run", config={"lr": 0.1, "dtype": torch.float32, "out": out})
if phase == "resume":
    acc.load_state(str(out / "ckpt"))

g = torch.Generator().manual_seed(100 + rank + (10 if phase == "resume" else 0))
losses = []
for _ in range(6 if phase == "first" else 4):
    x, y = torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)
    loss = torch.nn.functional.mse_loss(model(x), y)
    acc.backward(loss)
    opt.step()
    opt.zero_grad()
    mean = acc.reduce(loss.detach(), "mean").item()
    losses.append(mean)
    acc.log({"loss": mean})

if rank != 0:  # off the main process every tracker look-up answers, and does nothing
    assert acc.get_tracker("tensorboard", unwrap=True) is INERT_RUN
    acc.get_tracker("tensorboard", unwrap=True).add_scalar("x", 1.0)
    assert acc.get_tracker("tensorboard").log({"x": 1.0}) is None
    assert acc.get_tracker("every_rank", unwrap=True).name == "every_rank.rank1.jsonl"

if phase == "first":
    with acc.profile(ProfileKwargs(output_trace_dir=str(out / "traces"), record_shapes=True)):
        model(torch.randn(2, 4))
    acc.save_state(str(out / "ckpt"))

start = time.perf_counter()
try:
    acc.end_training()
    error = None
except TrackerError as err:
    error = str(err)
seconds = time.perf_counter() - start
result = {"pid": os.getpid(), "losses": losses, "end_seconds": seconds, "end_error": error}
(out / f"result.{phase}.rank{rank}.json").write_text(json.dumps(result))
