"""The training step never waits for the device: no host-device sync on the hot path.

On CUDA every `.item()`, `bool(tensor)`, `.tolist()` or `torch.cuda.synchronize()` stalls the host
until the GPU catches up, so the next step's kernels stop being queued ahead. These tests run 10
steps on CPU with every such call counted (the same calls sync on a GPU), and fail if one appears
in `accumulate`, the forward, `backward`, `clip_grad_norm_`, the optimizer or the scheduler. The
one read allowed is fp16's overflow check: one flag per optimizer step, read by GradScaler itself.
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from accelerando import Accelerator
from accelerando.devices.base import Device

# Tensor methods that copy a value to the host (a device sync on CUDA).
_TENSOR_READS = ("item", "tolist", "numpy", "cpu", "__bool__", "__float__", "__int__", "__index__")
# torch functions that answer with a Python value computed on the device.
_TORCH_READS = ("equal", "allclose", "is_nonzero")
STEPS = 10


def _device_classes() -> list[type]:
    found, todo = [], [Device]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return [cls for cls in found if "synchronize" in vars(cls)]


@contextlib.contextmanager
def count_syncs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Record every host-device read made inside the block, with the line that made it."""
    calls: list[str] = []

    def recording(name: str, original: Callable[..., Any] | None) -> Callable[..., Any]:
        def record(*args: Any, **kwargs: Any) -> Any:
            frame = traceback.extract_stack(limit=2)[0]  # the caller of the read
            calls.append(f"{name} at {frame.filename}:{frame.lineno}")
            return original(*args, **kwargs) if original is not None else None

        return record

    with monkeypatch.context() as patch:
        for name in _TENSOR_READS:
            patch.setattr(torch.Tensor, name, recording(f"Tensor.{name}", getattr(torch.Tensor, name)))
        for name in _TORCH_READS:
            patch.setattr(torch, name, recording(f"torch.{name}", getattr(torch, name)))
        # Replaced, not wrapped: they cannot run without CUDA, and any call at all is the failure.
        patch.setattr(torch.cuda, "synchronize", recording("torch.cuda.synchronize", None))
        patch.setattr(torch.cuda.Stream, "synchronize", recording("Stream.synchronize", None))
        patch.setattr(torch.cuda.Event, "synchronize", recording("Event.synchronize", None))
        for cls in _device_classes():
            patch.setattr(cls, "synchronize", recording(f"{cls.__name__}.synchronize", None))
        yield calls


def _train(
    monkeypatch: pytest.MonkeyPatch, precision: str, accumulation: int, optimizer: str = "sgd"
) -> tuple[list[str], int]:
    """10 steps of a full loop; returns the reads made and how many times autocast was entered."""
    acc = Accelerator(cpu=True, mixed_precision=precision, gradient_accumulation_steps=accumulation)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    if optimizer == "fused-sgd":
        opt: torch.optim.Optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, fused=True)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3)
    model, opt, sched = acc.prepare(model, opt, sched)
    data = [(torch.randn(4, 8), torch.randn(4, 1)) for _ in range(STEPS)]
    entered = [0]
    original_enter = torch.autocast.__enter__

    def enter(self: torch.autocast) -> Any:
        entered[0] += 1
        return original_enter(self)

    monkeypatch.setattr(torch.autocast, "__enter__", enter)
    with count_syncs(monkeypatch) as calls:
        for x, y in data:
            with acc.accumulate(model):
                loss = torch.nn.functional.mse_loss(model(x), y)
                acc.backward(loss)
                acc.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                sched.step()
                opt.zero_grad()
                _ = acc.sync_gradients, acc.optimizer_step_was_skipped
    return calls, entered[0]


@pytest.mark.parametrize(("precision", "accumulation"), [("no", 1), ("no", 4), ("bf16", 1), ("bf16", 4)])
def test_no_device_read_in_the_training_step(
    monkeypatch: pytest.MonkeyPatch, precision: str, accumulation: int
):
    calls, autocasts = _train(monkeypatch, precision, accumulation)
    assert calls == [], "host-device reads on the hot path:\n" + "\n".join(calls)
    # precision "no" enters no autocast at all; bf16 one per forward.
    assert autocasts == (0 if precision == "no" else STEPS)


@pytest.mark.parametrize(("accumulation", "optimizer"), [(1, "sgd"), (2, "sgd"), (1, "fused-sgd")])
def test_fp16_reads_one_flag_per_optimizer_step(
    monkeypatch: pytest.MonkeyPatch, accumulation: int, optimizer: str
):
    calls, _ = _train(monkeypatch, "fp16", accumulation, optimizer)
    assert len(calls) == STEPS // accumulation, "\n".join(calls)
    assert all(call.startswith("Tensor.item") for call in calls), calls


def test_the_counter_sees_the_reads_it_looks_for(monkeypatch: pytest.MonkeyPatch):
    """The patched methods really intercept C-implemented calls (otherwise the tests above prove nothing)."""
    t = torch.ones(3)
    with count_syncs(monkeypatch) as calls:
        t.sum().item()
        bool(torch.isfinite(t).all())
        if t[0] > 0:
            t.tolist()
        float(t[0])
        torch.cuda.synchronize()
        torch.equal(t, t)
    names = [c.split(" at ")[0] for c in calls]
    assert names == [
        "Tensor.item", "Tensor.__bool__", "Tensor.__bool__", "Tensor.tolist", "Tensor.__float__",
        "torch.cuda.synchronize", "torch.equal",
    ]  # fmt: skip


def test_fp16_skip_is_still_reported_without_reading_the_scale(monkeypatch: pytest.MonkeyPatch):
    """The skip flag comes from the step itself: an overflow is reported, a clean step is not."""
    for optimizer in ("sgd", "fused-sgd"):
        from accelerando.state import reset_runtime

        reset_runtime()
        acc = Accelerator(cpu=True, mixed_precision="fp16")
        model = torch.nn.Linear(2, 1)
        fused = optimizer == "fused-sgd"
        opt = acc.prepare(torch.optim.SGD(model.parameters(), lr=0.1, fused=fused))
        model = acc.prepare(model)
        before = model.weight.detach().clone()
        acc.backward(model(torch.randn(1, 2)).sum() * float("inf"))
        opt.step()
        assert acc.optimizer_step_was_skipped and torch.equal(before, model.weight), optimizer
        opt.zero_grad()
        acc.backward(model(torch.randn(1, 2)).sum())
        opt.step()
        assert not acc.optimizer_step_was_skipped and not torch.equal(before, model.weight), optimizer
