"""Small helpers with Accelerate's names: unwrapping models, pretty names, saving on the main process."""

from __future__ import annotations

from typing import Any

import torch

from accelerando import _runtime


def extract_model_from_parallel(
    model: torch.nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True
) -> torch.nn.Module:
    """The user's module inside DDP / FSDP / compile wrappers."""
    from accelerando._prepare import restore_forward

    runtime = _runtime.current()
    if runtime is not None and runtime.strategy is not None:
        model = runtime.strategy.unwrap(model)
    while isinstance(model, torch.nn.parallel.DistributedDataParallel | torch.nn.DataParallel):
        model = model.module
    if not keep_torch_compile and hasattr(model, "_orig_mod"):
        model = model._orig_mod  # type: ignore[assignment]
    if not keep_fp32_wrapper:
        restore_forward(model)
    return model


def get_pretty_name(obj: Any) -> str:
    if not hasattr(obj, "__qualname__") and not hasattr(obj, "__name__"):
        obj = getattr(obj, "__class__", obj)
    return getattr(obj, "__qualname__", getattr(obj, "__name__", str(obj)))


def wait_for_everyone() -> None:
    from accelerando.state import PartialState

    PartialState().wait_for_everyone()
