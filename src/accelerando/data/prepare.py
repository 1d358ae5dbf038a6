"""`prepare_data_loader`: turn a user's DataLoader into this process's prepared loader.

One function for both callers: Accelerate's signature (process coordinates from `PartialState`
or a device mesh) and the Accelerator's (`config=` its `DataLoaderConfiguration`). The user's
DataLoader is read, never modified: its dataset, collate_fn, workers, pin_memory and batch sampler
are reused. A plain `RandomSampler` with a generator of the user's keeps drawing from it, as in
Accelerate (every rank takes rank 0's generator state at each pass start); one without is swapped
(on a copy) for `SeedableRandomSampler` so every process agrees on the order without drawing from
the global RNG.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler

from accelerando.config.options import DataLoaderConfiguration
from accelerando.data.dispatch import (
    DataLoaderDispatcher,
    DispatchBatchSampler,
    GlobalBatchDataset,
    WholeBatchShard,
    WholeBatchStream,
)
from accelerando.data.loaders import DataLoaderShard, PreparedLoaderMixin, Progress, StatefulDataLoader
from accelerando.data.samplers import BatchSamplerShard, IterableDatasetShard, SeedableRandomSampler
from accelerando.data.transport import open_channel
from accelerando.devices import accelerator_device
from accelerando.state import GradientState, PartialState

try:
    from torchdata.stateful_dataloader.sampler import RandomSampler as _TorchdataRandomSampler

    _RANDOM_SAMPLERS: tuple[type, ...] = (RandomSampler, _TorchdataRandomSampler, SeedableRandomSampler)
except ImportError:  # pragma: no cover
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


def user_generator(batch_sampler: Any, config: DataLoaderConfiguration) -> torch.Generator | None:
    """The user's generator that the order comes from: a plain random sampler's own, unless
    `use_seedable_sampler` or a `data_seed` asks for (seed, epoch) orders."""
    inner = getattr(batch_sampler, "sampler", None)
    if config.use_seedable_sampler or config.data_seed is not None or not _is_random(inner):
        return None
    if isinstance(inner, SeedableRandomSampler):
        return None
    gen = getattr(inner, "generator", None)
    return gen if isinstance(gen, torch.Generator) else None


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


def _shard(
    dl: DataLoader, n: int, rank: int, config: DataLoaderConfiguration, dispatch: bool
) -> tuple[Any, Any, Progress, dict[str, Any]]:
    """(shard, the dataset the prepared loader reads, its `Progress`, torch DataLoader arguments).

    A map-style loader's batch sampler is wrapped in a `BatchSamplerShard` (a dispatcher's: every
    rank's batches), an iterable dataset in an `IterableDatasetShard` (a dispatcher's: all of it).
    """
    kwargs = loader_kwargs(dl)
    shard: Any
    if isinstance(dl.dataset, IterableDataset):
        if dl.batch_size is None:  # the dataset yields whole batches
            whole = WholeBatchStream if dispatch else WholeBatchShard
            shard = whole(dl.dataset, n, rank, config.split_batches, config.even_batches)
            kwargs.update(batch_size=None)
            return shard, shard, Progress(resolve_seed(config, dl, n, False)), kwargs
        stream = GlobalBatchDataset if dispatch else IterableDatasetShard
        shard = stream(
            dl.dataset, dl.batch_size, dl.drop_last, n, rank, config.split_batches, config.even_batches
        )
        kwargs.update(batch_size=shard.loader_batch_size, drop_last=False)
        return shard, shard, Progress(resolve_seed(config, dl, n, False)), kwargs
    batch_sampler, as_sampler = _source_batch_sampler(dl)
    seed = resolve_seed(config, dl, n, _is_random(getattr(batch_sampler, "sampler", None)))
    gen = user_generator(batch_sampler, config)
    if gen is None:
        batch_sampler = with_seedable_sampler(batch_sampler, seed)
    sampler = DispatchBatchSampler if dispatch else BatchSamplerShard
    shard = sampler(batch_sampler, n, rank, config.split_batches, config.even_batches)
    kwargs.update({"sampler": shard, "batch_size": None} if as_sampler else {"batch_sampler": shard})
    return (
        shard,
        dl.dataset,
        Progress(seed, generator=gen, loader_generator=gen is not None and dl.generator is gen),
        kwargs,
    )


def _check_args(dataloader: Any, num_processes: Any, process_index: Any, config: Any) -> None:
    if not isinstance(dataloader, DataLoader):
        raise TypeError(f"prepare_data_loader expects a torch DataLoader, got {type(dataloader).__name__}")
    if not isinstance(config, DataLoaderConfiguration):
        raise TypeError(f"config must be a DataLoaderConfiguration, got {type(config).__name__}")
    if not isinstance(num_processes, int) or num_processes < 1:
        raise ValueError(f"num_processes={num_processes!r} must be an integer >= 1")
    if not isinstance(process_index, int) or not 0 <= process_index < num_processes:
        raise ValueError(f"process_index={process_index!r} must be an integer in [0, {num_processes})")


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
    *,
    config: DataLoaderConfiguration | None = None,
    gradient_state: Any = None,
) -> DataLoader:
    """This process's prepared loader for `dataloader` (see docs/data.md for every mode).

    Accelerate's signature: what is not given (process coordinates, device, gradient state) comes
    from `PartialState()`, or the data-parallel coordinates of `torch_device_mesh`. With `config`
    (the Accelerator's call) the options come from it and nothing is looked up. A shuffle with
    the user's generator draws from it (rank 0's state, each pass); any other is a function of
    (seed, epoch) (`use_seedable_sampler=True` or a `data_seed` ask for that with a generator too).
    `rng_types` names the RNGs a shard loader gives rank 0's state at each pass start, as in
    Accelerate ("torch", the device's, "generator"; a dispatcher synchronises none, as there).
    """
    coords = _data_parallel_coords(torch_device_mesh) if torch_device_mesh is not None else None
    if coords is not None:
        num_processes, process_index = coords
    if config is None:
        state = PartialState()
        num_processes = state.num_processes if num_processes is None else num_processes
        process_index = state.process_index if process_index is None else process_index
        device = state.device if device is None else device
        gradient_state = GradientState() if gradient_state is None else gradient_state
        config = DataLoaderConfiguration(
            split_batches=split_batches,
            dispatch_batches=dispatch_batches,
            even_batches=even_batches,
            use_seedable_sampler=use_seedable_sampler,
            data_seed=data_seed,
            non_blocking=non_blocking,
            use_stateful_dataloader=use_stateful_dataloader,
        )
    _check_args(dataloader, num_processes, process_index, config)
    assert isinstance(num_processes, int) and isinstance(process_index, int)
    iterable = isinstance(dataloader.dataset, IterableDataset)
    dispatch = iterable if config.dispatch_batches is None else bool(config.dispatch_batches)
    if dispatch and num_processes > 1 and not (dist.is_available() and dist.is_initialized()):
        raise ValueError(
            "dispatch_batches=True with several processes needs torch.distributed initialized first"
        )
    args = _prepared_args(
        dataloader, num_processes, process_index, config, dispatch, device, put_on_device, gradient_state
    )
    if not dispatch:
        return DataLoaderShard(args["dataset"], rng_types=_rng_list(rng_types), _prepared=args)
    args.update(slice_fn=slice_fn_for_dispatch, world_size=num_processes)
    return DataLoaderDispatcher(args["dataset"], _prepared=args)


def _rng_list(rng_types: list[Any] | None) -> list[str] | None:
    """`rng_types` as plain names (an `RNGType` is its value), checked before any pass needs them."""
    if rng_types is None:
        return None
    names = [str(getattr(r, "value", r)) for r in rng_types]
    device = accelerator_device().type
    accepted = {"torch", "generator"} | ({device} if device != "cpu" else set())
    bad = [n for n in names if n not in accepted]
    if bad:
        raise ValueError(f"rng_types={bad!r}: accepted are {sorted(accepted)} on this machine")
    return names


def _prepared_args(
    dl: DataLoader,
    n: int,
    rank: int,
    config: DataLoaderConfiguration,
    dispatch: bool,
    device: Any,
    put_on_device: bool,
    gradient_state: Any,
) -> dict[str, Any]:
    """The arguments a prepared loader is built from (a dispatcher's `channel` included)."""
    shard, dataset, progress, kwargs = _shard(dl, n, rank, config, dispatch)
    kwargs.update(dataset=dataset, device=device, shard=shard, progress=progress, rank=rank)
    kwargs.update(put_on_device=put_on_device, gradient_state=gradient_state)
    kwargs.update(
        non_blocking=bool(config.non_blocking), use_stateful_dataloader=bool(config.use_stateful_dataloader)
    )
    kwargs.update(
        total_batch_size=shard.spec.global_size if getattr(shard, "batch_size", 1) else None,
        total_dataset_length=len(dl.dataset) if hasattr(dl.dataset, "__len__") else None,  # type: ignore[arg-type]
    )
    if dispatch:
        pin = bool(dl.pin_memory) and accelerator_device().type not in ("cpu", "xla")
        kwargs["channel"] = open_channel(n, rank, pin)  # collective, as every line above
    return kwargs


def _direct_args(
    dataset: Any,
    loader_args: dict[str, Any],
    *,
    device: Any = None,
    dispatch: bool = False,
    split_batches: bool = False,
    non_blocking: bool = False,
    stateful: bool = False,
    slice_fn: Callable[..., Any] | None = None,
) -> dict[str, Any]:
    """`DataLoaderShard(dataset, **loader_args)` or `DataLoaderDispatcher(...)` built directly, as
    in Accelerate: a shard is the whole loader of this one process; a dispatcher serves every
    process of `PartialState()` from rank 0. torch checks `loader_args`, as for a DataLoader."""
    if stateful and StatefulDataLoader is None:
        raise ImportError("use_stateful_dataloader=True needs torchdata>=0.8: pip install torchdata")
    with warnings.catch_warnings():  # torchdata 0.11 warns about its own deprecated call
        warnings.filterwarnings("ignore", message=".*set_vital.*")
        dl = (StatefulDataLoader if stateful else DataLoader)(dataset, **loader_args)
    n, rank = 1, 0
    if dispatch:
        state = PartialState()
        n, rank, device = state.num_processes, state.process_index, state.device
    config = DataLoaderConfiguration(
        split_batches=split_batches,
        dispatch_batches=dispatch,
        non_blocking=non_blocking,
        use_stateful_dataloader=stateful,
    )
    _check_args(dl, n, rank, config)
    args = _prepared_args(dl, n, rank, config, dispatch, device, device is not None, GradientState())
    if dispatch:
        args.update(slice_fn=slice_fn, world_size=n)
    return args


PreparedLoaderMixin._build_direct = staticmethod(_direct_args)
