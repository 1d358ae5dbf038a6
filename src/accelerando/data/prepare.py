"""`prepare_data_loader`: turn a user's DataLoader into this process's prepared loader.

The user's DataLoader is read, never modified: its dataset, collate_fn, workers, pin_memory and
batch sampler are reused; only a plain `RandomSampler` is swapped for `SeedableRandomSampler` so
every process agrees on the order without drawing from the global RNG.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler

from accelerando.config.options import DataLoaderConfiguration
from accelerando.data.loaders import DataLoaderShard, Progress
from accelerando.data.samplers import BatchSamplerShard, IterableDatasetShard, SeedableRandomSampler

try:
    from torchdata.stateful_dataloader import StatefulDataLoader
    from torchdata.stateful_dataloader.sampler import RandomSampler as _TorchdataRandomSampler

    _RANDOM_SAMPLERS: tuple[type, ...] = (RandomSampler, _TorchdataRandomSampler, SeedableRandomSampler)
except ImportError:  # pragma: no cover
    StatefulDataLoader = None  # type: ignore[assignment,misc]
    _RANDOM_SAMPLERS = (RandomSampler, SeedableRandomSampler)


def loader_kwargs(dl: DataLoader) -> dict[str, Any]:
    """The DataLoader arguments a prepared loader keeps from the user's loader."""
    kw: dict[str, Any] = {
        "num_workers": dl.num_workers,
        "collate_fn": dl.collate_fn,
        "pin_memory": dl.pin_memory,
        "timeout": dl.timeout,
        "worker_init_fn": dl.worker_init_fn,
        "multiprocessing_context": dl.multiprocessing_context,
        "persistent_workers": dl.persistent_workers,
    }
    if dl.num_workers > 0:
        kw["prefetch_factor"] = dl.prefetch_factor
    if getattr(dl, "pin_memory_device", ""):
        kw["pin_memory_device"] = dl.pin_memory_device
    if hasattr(dl, "in_order"):
        kw["in_order"] = dl.in_order
    if StatefulDataLoader is not None and isinstance(dl, StatefulDataLoader):
        kw["snapshot_every_n_steps"] = dl.snapshot_every_n_steps
    return kw


def _is_random(sampler: Any) -> bool:
    return type(sampler) in _RANDOM_SAMPLERS


def _seedable(sampler: Any, seed: int) -> SeedableRandomSampler:
    return SeedableRandomSampler(
        sampler.data_source,
        replacement=sampler.replacement,
        num_samples=sampler._num_samples,
        data_seed=seed,
    )


def with_seedable_sampler(batch_sampler: Any, seed: int) -> Any:
    """The batch sampler with a plain `RandomSampler` inside replaced (on a copy) by a seedable one."""
    inner = getattr(batch_sampler, "sampler", None)
    if not _is_random(inner):
        return batch_sampler
    if type(batch_sampler) is BatchSampler:
        return BatchSampler(_seedable(inner, seed), batch_sampler.batch_size, batch_sampler.drop_last)
    clone = copy.copy(batch_sampler)  # the user's own batch sampler class is kept
    clone.sampler = _seedable(inner, seed)
    return clone


def resolve_seed(config: DataLoaderConfiguration, dl: DataLoader, num_processes: int, shuffles: bool) -> int:
    """`data_seed`, else rank 0's seed (its generator's, or torch's initial seed), shared once."""
    if config.data_seed is not None:
        if not isinstance(config.data_seed, int) or isinstance(config.data_seed, bool):
            raise TypeError(f"DataLoaderConfiguration.data_seed={config.data_seed!r} must be an int or None")
        return config.data_seed
    gen = getattr(getattr(dl, "sampler", None), "generator", None) or dl.generator
    seed = int(gen.initial_seed()) if gen is not None else int(torch.initial_seed())
    if shuffles and num_processes > 1 and dist.is_available() and dist.is_initialized():
        box = [seed]
        dist.broadcast_object_list(box, src=0)
        seed = int(box[0])
    return seed


def _common(
    dl: DataLoader, device: torch.device | None, config: DataLoaderConfiguration, gradient_state: Any
) -> dict[str, Any]:
    return {
        "device": device,
        "non_blocking": bool(config.non_blocking),
        "gradient_state": gradient_state,
        "use_stateful_dataloader": bool(config.use_stateful_dataloader),
        "total_dataset_length": len(dl.dataset) if hasattr(dl.dataset, "__len__") else None,  # type: ignore[arg-type]
    }


def _source_batch_sampler(dl: DataLoader) -> tuple[Any, bool]:
    """(batch sampler, whether it is passed as `sampler=` with `batch_size=None`)."""
    if dl.batch_sampler is not None:
        return dl.batch_sampler, False
    if isinstance(dl.sampler, BatchSampler) or hasattr(dl.sampler, "batch_size"):
        return dl.sampler, True
    raise ValueError(
        "prepare needs a DataLoader that makes batches: give it a batch_size or a batch_sampler "
        f"(got batch_size=None with a {type(dl.sampler).__name__})"
    )


def shard_batch_sampler(
    dl: DataLoader,
    num_processes: int,
    process_index: int,
    config: DataLoaderConfiguration,
    shard_type: type[BatchSamplerShard],
) -> tuple[Any, int, dict[str, Any]]:
    """(the map-style loader's batch sampler wrapped in `shard_type`, the shuffle seed, the
    DataLoader arguments that use it in place of the original sampler or batch sampler)."""
    batch_sampler, as_sampler = _source_batch_sampler(dl)
    shuffles = _is_random(getattr(batch_sampler, "sampler", None))
    seed = resolve_seed(config, dl, num_processes, shuffles)
    batch_sampler = with_seedable_sampler(batch_sampler, seed)
    shard = shard_type(batch_sampler, num_processes, process_index, config.split_batches, config.even_batches)
    kwargs = loader_kwargs(dl)
    kwargs.update({"sampler": shard, "batch_size": None} if as_sampler else {"batch_sampler": shard})
    return shard, seed, kwargs


def prepare_map_style(
    dl: DataLoader,
    num_processes: int,
    process_index: int,
    device: torch.device | None,
    config: DataLoaderConfiguration,
    gradient_state: Any,
    put_on_device: bool = True,
) -> DataLoaderShard:
    shard, seed, kwargs = shard_batch_sampler(dl, num_processes, process_index, config, BatchSamplerShard)
    return DataLoaderShard(
        dl.dataset,
        shard=shard,
        progress=Progress(seed),
        rank=process_index,
        put_on_device=put_on_device,
        total_batch_size=shard.spec.global_size if shard.batch_size else None,
        **_common(dl, device, config, gradient_state),
        **kwargs,
    )


def prepare_iterable(
    dl: DataLoader,
    num_processes: int,
    process_index: int,
    device: torch.device | None,
    config: DataLoaderConfiguration,
    gradient_state: Any,
    put_on_device: bool = True,
) -> DataLoaderShard:
    if dl.batch_size is None:
        raise ValueError("prepare needs a batch_size for an IterableDataset DataLoader (got batch_size=None)")
    shard = IterableDatasetShard(
        dl.dataset,
        batch_size=dl.batch_size,
        drop_last=dl.drop_last,
        num_processes=num_processes,
        process_index=process_index,
        split_batches=config.split_batches,
        even_batches=config.even_batches,
    )
    kwargs = loader_kwargs(dl)
    kwargs.update(batch_size=shard.spec.per_rank, drop_last=False)
    return DataLoaderShard(
        shard,
        shard=shard,
        progress=Progress(resolve_seed(config, dl, num_processes, False)),
        rank=process_index,
        put_on_device=put_on_device,
        total_batch_size=shard.spec.global_size,
        **_common(dl, device, config, gradient_state),
        **kwargs,
    )


def _check_args(dataloader: Any, num_processes: int, process_index: int, config: Any) -> None:
    if not isinstance(dataloader, DataLoader):
        raise TypeError(f"prepare_data_loader expects a torch DataLoader, got {type(dataloader).__name__}")
    if not isinstance(config, DataLoaderConfiguration):
        raise TypeError(f"config must be a DataLoaderConfiguration, got {type(config).__name__}")
    if not isinstance(num_processes, int) or num_processes < 1:
        raise ValueError(f"num_processes={num_processes!r} must be an integer >= 1")
    if not isinstance(process_index, int) or not 0 <= process_index < num_processes:
        raise ValueError(f"process_index={process_index!r} must be an integer in [0, {num_processes})")


def prepare_data_loader(
    dataloader: DataLoader,
    *,
    num_processes: int,
    process_index: int,
    device: torch.device | None,
    config: DataLoaderConfiguration,
    gradient_state: Any,
    put_on_device: bool = True,
    slice_fn_for_dispatch: Callable[..., Any] | None = None,
) -> DataLoader:
    """This process's prepared loader for `dataloader` (see docs/data.md for every mode)."""
    _check_args(dataloader, num_processes, process_index, config)
    iterable = isinstance(dataloader.dataset, IterableDataset)
    dispatch = iterable if config.dispatch_batches is None else bool(config.dispatch_batches)
    args = (dataloader, num_processes, process_index, device, config, gradient_state, put_on_device)
    if dispatch:
        from accelerando.data.dispatch import prepare_dispatcher

        return prepare_dispatcher(*args, slice_fn=slice_fn_for_dispatch)
    return prepare_iterable(*args) if iterable else prepare_map_style(*args)
