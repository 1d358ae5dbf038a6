"""What `Accelerator.prepare` receives: each argument's kind, and a prepared loader's micro-batch size.

The composition of a model (precision conversion, parallelism, activation checkpointing, compile,
wrapping) is the strategy's: `Strategy.prepare_model`.
"""

from __future__ import annotations

from typing import Any

import torch

from accelerando.strategies.compose import restore_forward, wrap_forward_in_autocast

MODEL, OPTIMIZER, SCHEDULER, DATALOADER, OTHER = "model", "optimizer", "scheduler", "dataloader", "other"
KINDS = (MODEL, OPTIMIZER, SCHEDULER, DATALOADER, OTHER)

__all__ = ["DATALOADER", "KINDS", "MODEL", "OPTIMIZER", "OTHER", "SCHEDULER", "kind_of", "micro_batch_size"]
__all__ += ["restore_forward", "wrap_forward_in_autocast"]


def kind_of(obj: Any) -> str:
    from torch.utils.data import DataLoader

    declared = getattr(type(obj), "prepare_kind", None)  # DummyOptim / DummyScheduler (engine-built)
    if declared in KINDS:
        return str(declared)
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


def micro_batch_size(loader: Any, data_parallel_size: int) -> int | None:
    """Samples one rank sees per step, when the prepared loader knows its global batch size."""
    total = getattr(loader, "total_batch_size", None)
    if isinstance(total, int) and total > 0:
        return max(total // max(data_parallel_size, 1), 1)
    size = getattr(loader, "batch_size", None)
    return size if isinstance(size, int) else None
