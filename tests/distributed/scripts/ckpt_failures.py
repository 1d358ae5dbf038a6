"""Saves that fail half-way, on 2 processes: the previous checkpoint must stay loadable.

`raise`: a registered object raises inside save_state on rank 0; both ranks get an error, the
earlier checkpoint in the same folder is intact, and the half-written staging folder is removed.
`kill`: rank 0 SIGKILLs itself in the middle of the second automatic save; the test then checks
the folders from outside (the job itself dies).
"""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path

import torch

from accelerando import Accelerator, ProjectConfiguration
from accelerando.checkpoint.atomic import CheckpointError
from accelerando.utils import set_seed


class Failing:
    def __init__(self, how: str) -> None:
        self.how = how

    def state_dict(self) -> dict:
        if self.how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError("registered object failed on purpose")

    def load_state_dict(self, state: dict) -> None:
        pass


def build(project: Path | None = None) -> tuple:
    set_seed(7)
    cfg = (
        ProjectConfiguration(project_dir=str(project), automatic_checkpoint_naming=True) if project else None
    )
    acc = Accelerator(project_config=cfg)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = acc.prepare(model, opt)
    return acc, model, opt


def step(acc, model, opt) -> None:
    acc.backward(model(torch.randn(4, 4)).pow(2).mean())
    opt.step()
    opt.zero_grad()


def weights(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def run_raise(out: Path) -> None:
    acc, model, opt = build()
    step(acc, model, opt)
    good = acc.save_state(str(out / "ck"))
    saved = weights(model)
    step(acc, model, opt)
    acc.register_for_checkpointing(Failing("raise"))
    try:
        acc.save_state(str(out / "ck"))
    except (RuntimeError, CheckpointError) as err:  # rank 0: its own error; rank 1: told another rank failed
        expected = "on purpose" if acc.is_main_process else "another rank failed"
        assert expected in str(err), str(err)
    else:
        raise AssertionError("save_state did not fail")
    assert not (out / ".ck.incomplete").exists(), "the failed save's staging folder was left behind"
    acc._custom_objects.pop()
    after = weights(model)
    assert not all(torch.equal(a, b) for a, b in zip(after, saved))
    acc.load_state(good)
    assert all(torch.equal(a, b) for a, b in zip(saved, model.parameters()))
    acc.print("FAILURES raise ok")


def run_kill(out: Path) -> None:
    acc, model, opt = build(out / "proj")
    step(acc, model, opt)
    acc.save_state()  # checkpoint_0, complete
    if acc.is_main_process:
        torch.save(weights(model), out / "good_weights.pt")
    step(acc, model, opt)
    acc.register_for_checkpointing(Failing("kill" if acc.is_main_process else "raise"))
    acc.save_state()  # rank 0 dies in here, after the model and optimizer files are written
    raise AssertionError("unreachable: rank 0 was killed")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["raise", "kill"])
    parser.add_argument("out")
    args = parser.parse_args()
    (run_raise if args.mode == "raise" else run_kill)(Path(args.out))
