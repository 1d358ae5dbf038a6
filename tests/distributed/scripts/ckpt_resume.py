"""The resume contract: train 3 epochs (A); train and save mid-epoch 2, stop (B); a fresh process loads,
skips the batches already seen and finishes (C). C's weights must equal A's exactly.

Phases (one torchrun launch each, every variant inside): `ab` runs A and B; `one` (1 process)
loads a 2-process checkpoint and saves a 1-process one; `c` runs C and loads the 1-process save.
Variants: plain, gradient accumulation 2, fp16 autocast + GradScaler.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from accelerando import Accelerator, GradScalerKwargs
from accelerando.state import reset_runtime
from accelerando.utils import set_seed

VARIANTS = {
    "plain": {},
    "accum": {"gradient_accumulation_steps": 2},
    "fp16": {
        "mixed_precision": "fp16",
        "kwargs_handlers": [GradScalerKwargs(init_scale=2.0**17, growth_interval=3)],
    },
}
EPOCHS = 3
STOP = (1, 4)  # B saves after 4 batches of the second epoch (an accumulation boundary)


class LoopPosition:
    """The user's own loop counters, registered for checkpointing."""

    def __init__(self) -> None:
        self.epoch, self.batch = 0, 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "batch": self.batch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.batch = state["epoch"], state["batch"]


def build(variant: str) -> tuple:
    reset_runtime()
    set_seed(1234)
    acc = Accelerator(**VARIANTS[variant])
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(64, 4, generator=g), torch.randn(64, 1, generator=g))
    dl = DataLoader(data, batch_size=4, shuffle=True)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 16), torch.nn.Dropout(0.2), torch.nn.ReLU(), torch.nn.Linear(16, 1)
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=1.0, end_factor=0.1, total_iters=40)
    model, opt, dl, sched = acc.prepare(model, opt, dl, sched)
    pos = LoopPosition()
    acc.register_for_checkpointing(pos)
    return acc, model, opt, dl, sched, pos


def train(acc, model, opt, dl, sched, pos, stop: tuple[int, int] | None = None) -> None:
    first, skip = pos.epoch, pos.batch
    for epoch in range(first, EPOCHS):
        loader = acc.skip_first_batches(dl, skip) if epoch == first and skip else dl
        for i, (x, y) in enumerate(loader, start=skip if epoch == first else 0):
            with acc.accumulate(model):
                loss = F.mse_loss(model(x).float(), y)
                acc.backward(loss)
                opt.step()
                sched.step()
                opt.zero_grad()
            pos.epoch, pos.batch = epoch, i + 1
            if stop == (epoch, i + 1):
                return
        pos.epoch, pos.batch = epoch + 1, 0


def summary(acc, model, sched) -> dict:
    return {
        "weights": {k: v.clone() for k, v in acc.unwrap_model(model).state_dict().items()},
        "lr": sched.get_last_lr(),
        "scaler": acc.precision.state_dict(),
        "step": acc.step,
    }


def phase_ab(out: Path) -> None:
    for variant in VARIANTS:
        acc, model, opt, dl, sched, pos = build(variant)
        train(acc, model, opt, dl, sched, pos)
        assert pos.epoch == EPOCHS
        if acc.is_main_process:
            torch.save(summary(acc, model, sched), out / f"A_{variant}.pt")
        acc, model, opt, dl, sched, pos = build(variant)
        train(acc, model, opt, dl, sched, pos, stop=STOP)
        acc.save_state(str(out / f"B_{variant}"))
        if variant == "fp16":
            assert acc.precision.state_dict()["scale"] != 2.0**17, (
                "the scaler never changed: test is too weak"
            )


def phase_one(out: Path) -> None:
    """1 process loads the 2-process checkpoint (rank 0's RNG), checks it and saves its own."""
    acc, model, opt, dl, sched, pos = build("plain")
    acc.load_state(str(out / "B_plain"))
    from safetensors.torch import load_file

    saved = load_file(str(out / "B_plain" / "model.safetensors"))
    assert all(torch.equal(saved[k], v) for k, v in acc.unwrap_model(model).state_dict().items())
    assert (pos.epoch, pos.batch) == STOP
    acc.save_state(str(out / "one_proc"))
    torch.save(summary(acc, model, sched), out / "one_proc_summary.pt")


def phase_c(out: Path) -> None:
    report = {}
    for variant in VARIANTS:
        acc, model, opt, dl, sched, pos = build(variant)
        acc.load_state(str(out / f"B_{variant}"))
        assert (pos.epoch, pos.batch) == STOP
        train(acc, model, opt, dl, sched, pos)
        got, want = summary(acc, model, sched), torch.load(out / f"A_{variant}.pt", weights_only=True)
        diff = {k: (got["weights"][k] - v).abs().max().item() for k, v in want["weights"].items()}
        assert all(torch.equal(got["weights"][k], v) for k, v in want["weights"].items()), (variant, diff)
        assert got["lr"] == want["lr"] and got["scaler"] == want["scaler"] and got["step"] == want["step"], (
            variant
        )
        report[variant] = "equal"
    acc, model, opt, dl, sched, pos = build("plain")
    acc.load_state(str(out / "one_proc"))  # and the reverse: 1 process -> 2 processes
    want = torch.load(out / "one_proc_summary.pt", weights_only=True)
    assert all(torch.equal(v, want["weights"][k]) for k, v in acc.unwrap_model(model).state_dict().items())
    if acc.is_main_process:
        print("RESUME", json.dumps(report))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("phase", choices=["ab", "one", "c"])
    parser.add_argument("out")
    args = parser.parse_args()
    {"ab": phase_ab, "one": phase_one, "c": phase_c}[args.phase](Path(args.out))
