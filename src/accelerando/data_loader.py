"""Accelerate's `accelerate.data_loader` module: the same names, defined in `accelerando.data`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader

from accelerando.config.options import DataLoaderConfiguration
from accelerando.data import prepare as _prepare
from accelerando.data.dispatch import DataLoaderDispatcher
from accelerando.data.loaders import DataLoaderShard, DataLoaderStateMixin
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


def _data_parallel_coords(mesh: Any) -> tuple[int, int] | None:
    """(size, rank) over the mesh's data-parallel dimensions, or None when it names none."""
    names = [
        n for n in (getattr(mesh, "mesh_dim_names", None) or ()) if n in ("dp_replicate", "dp_shard", "dp")
    ]
    if not names:
        return None
    size, rank = 1, 0
    for name in names:
        sub = mesh[name]
        rank = rank * sub.size() + sub.get_local_rank()
        size *= sub.size()
    return size, rank


def prepare_data_loader(
    dataloader: DataLoader,
    device: torch.device | None = None,
    num_processes: int | None = None,
    process_index: int | None = None,
    split_batches: bool = False,
    put_on_device: bool = False,
    rng_types: list[Any] | None = None,
    dispatch_batches: bool | None = None,
    even_batches: bool = True,
    slice_fn_for_dispatch: Callable[..., Any] | None = None,
    use_seedable_sampler: bool = False,
    data_seed: int | None = None,
    non_blocking: bool = False,
    use_stateful_dataloader: bool = False,
    torch_device_mesh: Any = None,
) -> DataLoader:
    """Accelerate's signature; process info defaults to `PartialState()`.

    `rng_types` and `use_seedable_sampler` are accepted for compatibility: shuffling is always a
    function of (seed, epoch), so there is no RNG state to synchronise.
    """
    from accelerando.state import GradientState, PartialState

    state = PartialState()
    coords = _data_parallel_coords(torch_device_mesh) if torch_device_mesh is not None else None
    if coords is not None:
        num_processes, process_index = coords
    config = DataLoaderConfiguration(
        split_batches=split_batches,
        dispatch_batches=dispatch_batches,
        even_batches=even_batches,
        use_seedable_sampler=use_seedable_sampler,
        data_seed=data_seed,
        non_blocking=non_blocking,
        use_stateful_dataloader=use_stateful_dataloader,
    )
    return _prepare.prepare_data_loader(
        dataloader,
        num_processes=state.num_processes if num_processes is None else num_processes,
        process_index=state.process_index if process_index is None else process_index,
        device=device if device is not None else state.device,
        config=config,
        gradient_state=GradientState(),
        put_on_device=put_on_device,
        slice_fn_for_dispatch=slice_fn_for_dispatch,
    )
