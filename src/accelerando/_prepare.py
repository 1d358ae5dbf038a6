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
__all__ += ["is_prepared", "mark_prepared", "restore_forward", "wrap_forward_in_autocast"]

# Accelerate's marker: libraries (transformers' Trainer) read it, and a second `prepare` of a marked
# object returns it unchanged instead of wrapping it twice.
PREPARED_FLAG = "_is_accelerate_prepared"


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


def is_prepared(obj: Any) -> bool:
    return bool(getattr(obj, PREPARED_FLAG, False))


def mark_prepared(obj: Any) -> Any:
    try:
        setattr(obj, PREPARED_FLAG, True)
    except (AttributeError, TypeError):  # objects with __slots__ cannot carry the marker
        pass
    return obj


def register_once(container: list[Any], obj: Any) -> Any:
    """Append by identity (`in` would call `__eq__`), so preparing twice registers once."""
    if not any(o is obj for o in container):
        container.append(obj)
    return obj


def drop_iterable(loaders: list[Any]) -> bool:
    """Remove the loaders over an IterableDataset from `loaders` (in place); True if there were any.

    `join_uneven_inputs(even_batches=...)` overrides only map-style loaders, as Accelerate does."""
    iterable = [
        dl for dl in loaders if isinstance(getattr(dl, "dataset", None), torch.utils.data.IterableDataset)
    ]
    for dl in iterable:
        loaders.remove(dl)
    return bool(iterable)
