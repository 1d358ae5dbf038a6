"""Pins the learning rate at every micro-step of a prepared scheduler (docs/scheduler.md, 1 process).

The 2-process tables of the same page are pinned by tests/distributed/scripts/data_modes.py.
Schedule: LambdaLR with base LR 1.0 and factor max(0, 1 - t/10) after t scheduler steps.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

from accelerando import Accelerator, DataLoaderConfiguration


def lr_trace(acc: Accelerator, batches_per_rank: int, schedule=None) -> list[float]:
    """Train on `batches_per_rank` micro-batches; the LR after each one, rounded for readability."""
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    sched = (
        schedule(opt) if schedule else torch.optim.lr_scheduler.LambdaLR(opt, lambda t: max(0.0, 1 - t / 10))
    )
    size = batches_per_rank * 2 * acc.num_processes
    loader = DataLoader(torch.ones(size, 1), batch_size=2)
    model, opt, sched, loader = acc.prepare(model, opt, sched, loader)
    out = []
    for x in loader:
        with acc.accumulate(model):
            acc.backward(model(x).sum() * 0)
            opt.step()
            sched.step()
            opt.zero_grad()
        out.append(round(sched.get_last_lr()[0], 6))
    return out


# micro-step:                 1    2    3    4    5    6    7    8
NO_ACCUMULATION = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2]
ACCUMULATE_2 = [1.0, 0.9, 0.9, 0.8, 0.8, 0.7, 0.7, 0.6]
ACCUMULATE_3 = [1.0, 1.0, 0.9, 0.9, 0.9, 0.8, 0.8, 0.7]  # the last, short window syncs at the end of data


@pytest.mark.parametrize(
    "steps,expected",
    [(1, NO_ACCUMULATION), (2, ACCUMULATE_2), (3, ACCUMULATE_3)],
    ids=["acc1", "acc2", "acc3"],
)
def test_one_process_lr_at_every_step(steps: int, expected: list[float]) -> None:
    assert lr_trace(Accelerator(gradient_accumulation_steps=steps), 8) == expected


def test_split_batches_changes_nothing_on_one_process() -> None:
    acc = Accelerator(dataloader_config=DataLoaderConfiguration(split_batches=True))
    assert lr_trace(acc, 8) == NO_ACCUMULATION


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before:UserWarning")
def test_step_scheduler_with_optimizer_false_steps_every_call() -> None:
    acc = Accelerator(gradient_accumulation_steps=2, step_scheduler_with_optimizer=False)
    assert lr_trace(acc, 4) == [0.9, 0.8, 0.7, 0.6]


def test_one_cycle_is_never_stepped_past_its_end() -> None:
    def one_cycle(opt):
        return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1.0, total_steps=4)

    trace = lr_trace(Accelerator(), 6, one_cycle)  # 6 optimizer steps, 4 scheduled: no error
    assert len(trace) == 6 and trace[-1] == trace[-2] == trace[-3]


def test_one_cycle_with_accumulation_counts_skipped_micro_steps() -> None:
    """Accelerate's quirk, kept: `adjust_scheduler` bumps `_step_count` on accumulation micro-steps,
    and the OneCycle guard compares that count with `total_steps`, so it stops after 2 real steps."""

    def one_cycle(opt):
        return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1.0, total_steps=4)

    trace = lr_trace(Accelerator(gradient_accumulation_steps=2), 8, one_cycle)
    assert trace == [0.04, 0.811746, 0.811746, 0.283061, 0.283061, 0.283061, 0.283061, 0.283061]
