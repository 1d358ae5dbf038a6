"""Accelerate's `accelerate.data_loader` module: the same names, defined in `accelerando.data`."""

from __future__ import annotations

from typing import Any

from torch.utils.data import BatchSampler, DataLoader

from accelerando.data.dispatch import DataLoaderDispatcher
from accelerando.data.loaders import DataLoaderShard, DataLoaderStateMixin
from accelerando.data.prepare import prepare_data_loader
from accelerando.data.samplers import BatchSamplerShard, IterableDatasetShard, SeedableRandomSampler
from accelerando.data.skip import SkipBatchSampler, SkipDataLoader, skip_first_batches

__all__ = [
    "BatchSamplerShard",
    "DataLoaderDispatcher",
    "DataLoaderShard",
    "DataLoaderStateMixin",
    "IterableDatasetShard",
    "SeedableRandomSampler",
    "SkipBatchSampler",
    "SkipDataLoader",
    "get_sampler",
    "prepare_data_loader",
    "skip_first_batches",
]


def get_sampler(dataloader: DataLoader) -> Any:
    """The index sampler inside a DataLoader's batch sampler (or its `sampler=` batch sampler)."""
    if isinstance(dataloader.sampler, BatchSampler):
        return getattr(dataloader.sampler, "sampler", None)
    inner = getattr(dataloader.batch_sampler, "batch_sampler", dataloader.batch_sampler)
    return getattr(inner, "sampler", None)
