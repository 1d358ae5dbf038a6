"""Classifying what `prepare` receives and wrapping each kind; the order of composition is code here."""

from __future__ import annotations

import functools
from typing import Any

import torch

from accelerando.ops.tree import convert_to_fp32
from accelerando.parallel.compile import compile_model
from accelerando.precision.base import Precision

_LOW_PRECISION = (torch.float16, torch.bfloat16)
MODEL, OPTIMIZER, SCHEDULER, DATALOADER, OTHER = "model", "optimizer", "scheduler", "dataloader", "other"


def kind_of(obj: Any) -> str:
    from torch.utils.data import DataLoader

    if isinstance(obj, torch.nn.Module):
        return MODEL
    if isinstance(obj, torch.optim.Optimizer):
        return OPTIMIZER
    if isinstance(obj, torch.optim.lr_scheduler.LRScheduler) or (
        hasattr(obj, "step") and hasattr(obj, "optimizer") and hasattr(obj, "state_dict")
    ):
        return SCHEDULER
    if isinstance(obj, DataLoader) or type(obj).__name__ == "StatefulDataLoader":
        return DATALOADER
    return OTHER


def wrap_forward_in_autocast(model: torch.nn.Module, precision: Precision) -> None:
    """Run `model.forward` under the precision's autocast and return fp32 outputs (Accelerate's contract)."""
    if not precision.wraps_forward or hasattr(model, "_original_forward"):
        return
    original = model.forward

    @functools.wraps(original)
    def forward(*args: Any, **kwargs: Any) -> Any:
        with precision.autocast():
            out = original(*args, **kwargs)
        if isinstance(out, torch.Tensor):  # the common case, without walking a structure
            return out.float() if out.dtype in _LOW_PRECISION else out
        return convert_to_fp32(out)

    model._original_forward = original  # type: ignore[assignment]
    model.forward = forward  # type: ignore[method-assign]


def restore_forward(model: torch.nn.Module) -> None:
    original = model.__dict__.pop("_original_forward", None)
    if original is not None:
        model.__dict__.pop("forward", None)
        if getattr(model.forward, "__func__", None) is not getattr(original, "__func__", None):
            model.forward = original  # type: ignore[method-assign]


def refuse_multi_device_map(model: torch.nn.Module, distributed: bool) -> None:
    device_map = getattr(model, "hf_device_map", None)
    if distributed and isinstance(device_map, dict) and len(set(device_map.values())) > 1:
        raise ValueError(
            "this model was dispatched over several devices (hf_device_map "
            f"{sorted(set(map(str, device_map.values())))}); it cannot be trained with data parallelism. "
            "Load it on one device per process, or use FSDP."
        )


def prepare_module(
    model: torch.nn.Module,
    *,
    device: torch.device | None,
    precision: Precision,
    dynamo: Any,
    distributed: bool,
) -> torch.nn.Module:
    """Precision conversion -> device placement -> autocast forward -> compile (wrapping is the strategy's)."""
    refuse_multi_device_map(model, distributed)
    model = precision.convert_module(model)
    on_meta = any(p.is_meta for p in model.parameters())  # FSDP cpu_ram_efficient_loading materializes it
    if device is not None and getattr(model, "hf_device_map", None) is None and not on_meta:
        model = model.to(device)
    wrap_forward_in_autocast(model, precision)
    return compile_model(model, dynamo)
