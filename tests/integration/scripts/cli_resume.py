"""Training that survives a killed rank: checkpoints every EVERY steps, resumes from the newest.

Usage: accelerando launch --max_restarts 1 ... cli_resume.py PROJECT_DIR KILL_AT [sync|async]
On the first attempt rank 1 SIGKILLs itself right after step KILL_AT (`sync`), or, with every save
asynchronous (`async`), in the middle of the background write of the checkpoint taken at step
KILL_AT (its staging folder holds some files, no manifest). Every attempt calls
`load_state()` when a complete checkpoint exists; the prepared loader then yields exactly the
batches not yet trained on, so the loop needs no skip arithmetic. After finishing, the same
processes train the same model again from step 0 without interruption (fresh objects, no
checkpoints) and print whether the two final weights are bit-identical.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from accelerando import Accelerator, ProjectConfiguration
from accelerando.checkpointing import latest_checkpoint
from accelerando.config import env
from accelerando.utils import set_seed

EPOCHS, EVERY = 3, 4


class Progress:
    def __init__(self) -> None:
        self.steps = 0

    def state_dict(self) -> dict[str, int]:
        return {"steps": self.steps}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.steps = state["steps"]


def build(acc: Accelerator) -> tuple[Any, ...]:
    set_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Dropout(0.2), torch.nn.Linear(16, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.9)
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(64, 4, generator=g), torch.randn(64, 2, generator=g))
    return acc.prepare(model, opt, sched, DataLoader(data, batch_size=4, shuffle=True))


def kill_during_background_write(iteration: int) -> None:
    """Rank 1 dies while its background thread writes checkpoint_<iteration>'s data files."""
    from accelerando.checkpoint import state_dict as sd_io

    real = sd_io.write_data_file

    def write(path: Path, obj: Any) -> None:
        if path.parent.name == f".checkpoint_{iteration}.incomplete":
            os.kill(os.getpid(), signal.SIGKILL)
        real(path, obj)

    sd_io.write_data_file = write


def train(
    acc: Accelerator,
    objects: tuple[Any, ...],
    progress: Progress,
    save: bool,
    kill_at: int = 0,
    asynchronous: bool = False,
) -> list:
    model, opt, sched, loader = objects
    for _ in range(loader.epoch, EPOCHS):
        for x, y in loader:
            acc.backward(F.mse_loss(model(x), y))
            opt.step()
            sched.step()
            opt.zero_grad()
            progress.steps += 1
            if progress.steps == kill_at and acc.process_index == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            if save and progress.steps % EVERY == 0:
                acc.save_state(async_save=asynchronous)
    return [p.detach().clone() for p in acc.unwrap_model(model).parameters()]


def main() -> None:
    project, kill_at = Path(sys.argv[1]), int(sys.argv[2])
    asynchronous = sys.argv[3:] == ["async"]
    first = env.restart_count() == 0
    config = ProjectConfiguration(project_dir=str(project), automatic_checkpoint_naming=True)
    acc = Accelerator(project_config=config)
    objects, progress = build(acc), Progress()
    acc.register_for_checkpointing(progress)
    if latest_checkpoint(project / "checkpoints") is not None:
        acc.load_state()  # the newest complete checkpoint; a partial one is removed
        acc.print(f"RESUMED at step {progress.steps} (epoch {objects[3].epoch})")
    if asynchronous and first and acc.process_index == 1:
        kill_during_background_write(kill_at // EVERY - 1)  # checkpoint_0 is taken at step EVERY
    kill_step = kill_at if first and not asynchronous else 0
    resumed = train(acc, objects, progress, save=True, kill_at=kill_step, asynchronous=asynchronous)
    acc.print(f"FINISHED {progress.steps} steps")
    whole = train(acc, build(acc), Progress(), save=False)  # the uninterrupted reference
    same = all(torch.equal(a, b) for a, b in zip(resumed, whole, strict=True))
    acc.print(
        "BIT-IDENTICAL"
        if same
        else f"DIFFERENT: {[(a - b).abs().max().item() for a, b in zip(resumed, whole)]}"
    )
    acc.end_training()  # waits for the last asynchronous save


if __name__ == "__main__":
    main()
