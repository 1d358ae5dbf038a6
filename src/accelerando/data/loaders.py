"""Prepared data loaders: one pass = yield each batch, flag the last, keep the gradient state informed.

`PreparedLoaderMixin` holds everything a prepared loader promises the rest of the library
(`end_of_dataloader`, `remainder`, `batches_yielded`, exact `len`, `set_epoch`, `state_dict`); the
concrete classes only say where batches come from: this process's shard (`DataLoaderShard`) or
rank 0 (`dispatch.DataLoaderDispatcher`). Each has a torchdata `StatefulDataLoader` twin.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from accelerando.data.samplers import SeedableRandomSampler, call_set_epoch
from accelerando.data.sharding import remainder as sh_remainder
from accelerando.data.worker_start import open_watched
from accelerando.ops.tree import send_to_device
from accelerando.utils.random import synchronize_rng_states

try:
    from torchdata.stateful_dataloader import StatefulDataLoader
except ImportError:  # pragma: no cover - torchdata is optional
    StatefulDataLoader = None  # type: ignore[assignment,misc]

_END = object()
_LATER = object()  # the next batch is read only once the user asks for it
STATE_VERSION = 1


@dataclass
class Progress:
    """Epoch and shuffle seed, shared by a prepared loader and the views `skip_first_batches` makes.

    `generator` is set when the order comes from the user's own generator (Accelerate's default
    with one): each pass then draws from it as a plain DataLoader would, after every rank took
    rank 0's state, and `pass_state` keeps its state at the pass's start, which is
    what a resumed pass needs to draw the same order again.
    """

    seed: int
    epoch: int = 0
    active: Any = None  # the loader (original or skip view) whose pass is under way: it owns the position
    generator: torch.Generator | None = None
    loader_generator: bool = False  # it is also the user's DataLoader's `generator=`
    pass_state: torch.Tensor | None = None

    def start_pass(self, draws_base_seed: bool) -> None:
        """Align the user's generator across ranks, remember it, and draw the worker base seed that
        a plain DataLoader given this generator draws before its sampler (so the orders stay equal)."""
        gen = self.generator
        if gen is None:
            return
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            box = [gen.get_state()]
            dist.broadcast_object_list(box, src=0)
            gen.set_state(box[0])
        self.pass_state = gen.get_state()
        if draws_base_seed and self.loader_generator:
            torch.empty((), dtype=torch.int64).random_(generator=gen)


def worker_seed(seed: int, epoch: int, rank: int) -> int:
    """Base seed of the DataLoader workers: differs per rank and epoch, reproducible, drawn from nothing."""
    state = np.random.SeedSequence([seed % 2**64, epoch, rank]).generate_state(2, np.uint32)
    return int(state[0]) << 31 | int(state[1]) >> 1


class DataLoaderStateMixin:
    """End-of-data bookkeeping read by `GradientState` (Accelerate's name and attributes)."""

    end_of_dataloader: bool = False
    remainder: int = -1
    batches_yielded: int = 0
    gradient_state: Any = None

    def reset(self) -> None:
        self.end_of_dataloader = False
        self.remainder = -1
        self.batches_yielded = 0

    def begin(self) -> None:
        self.reset()
        if self.gradient_state is not None:
            self.gradient_state._add_dataloader(self)

    def end(self) -> None:
        if self.gradient_state is not None:
            self.gradient_state._remove_dataloader(self)


def _end_workers(iterator: Any) -> None:
    """End a DataLoader iterator's worker processes now, and wait for the threads that fed them.

    torch closes the index queues when a pass ends, and each queue's feeder thread exits a moment
    later on its own; ending them here keeps a pass from leaving threads behind it. (They were once
    blamed for a rare hang of a forked worker; the thread that hangs one is a gloo thread creating a
    Python thread state, see `worker_start`.) A single-process iterator has nothing to end.
    """
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is None:
        return
    shutdown()
    for queue in getattr(iterator, "_index_queues", ()):
        feeder = getattr(queue, "_thread", None)  # multiprocessing.Queue's feeder, once started
        if feeder is not None:
            feeder.join(timeout=10)


class PreparedLoaderMixin(DataLoaderStateMixin):
    """The behaviour shared by every prepared loader; subclasses provide `_source`."""

    device: torch.device | None = None
    _progress: Progress
    _start: int = 0  # absolute batch at which the next pass starts (resume / skip_first_batches)
    _skip_each_pass: int = 0  # Accelerate's `skip_batches=` constructor argument: every pass skips them
    _pass_start: int = 0
    _open: bool = False  # the last pass started and did not finish: position = pass start + yielded
    _stateful: bool = False
    _yield_state: Any = None
    _pending_state: Any = None
    _stateful_twin: Any = None  # the subclass that also derives from torchdata's StatefulDataLoader
    _pass_batches: int | None = None  # batches the pass under way yields, when its start knew it
    rng_types: list[Any] | None = None  # RNGs given rank 0's state at each pass start (Accelerate's)

    # Builds the `_prepared` arguments of a loader constructed like a DataLoader (Accelerate's way);
    # set by `data.prepare`, which holds the logic shared with `prepare_data_loader`.
    _build_direct: Any = None

    def __new__(cls, *args: Any, _prepared: dict[str, Any] | None = None, **kwargs: Any) -> Any:
        if _prepared is not None:
            stateful = bool(_prepared.get("use_stateful_dataloader"))
        else:
            bound = inspect.signature(cls.__init__).bind_partial(None, *args, **kwargs).arguments
            stateful = bool(bound.get("use_stateful_dataloader", False))
        if stateful and StatefulDataLoader is None:
            raise ImportError("use_stateful_dataloader=True needs torchdata>=0.8: pip install torchdata")
        if stateful and not issubclass(cls, StatefulDataLoader):
            cls = cls._stateful_twin
        return object.__new__(cls)

    def _direct(self, dataset: Any, kwargs: dict[str, Any], **options: Any) -> dict[str, Any]:
        if PreparedLoaderMixin._build_direct is None:  # pragma: no cover - data/__init__ imports prepare
            raise RuntimeError("import accelerando.data before building a prepared loader directly")
        return PreparedLoaderMixin._build_direct(dataset, kwargs, **options)  # type: ignore[no-any-return]

    def _accelerate_args(self, skip_batches: int, iteration: int, **attrs: Any) -> None:
        """Accelerate's constructor arguments: every pass starts at batch `skip_batches` (as there;
        `skip_first_batches` skips in the next pass only), the epoch counter at `iteration`; the
        rest are kept as attributes of the same names."""
        for name, value in (("skip_batches", skip_batches), ("iteration", iteration)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name}={value!r} must be an integer >= 0")
        if skip_batches:
            self._start = self._skip_each_pass = skip_batches
        if iteration:
            self._progress.epoch = iteration
        for name, value in attrs.items():
            setattr(self, name, value)

    def _setup(
        self,
        dataset: Any,
        device: torch.device | None = None,
        *,
        shard: Any,
        progress: Progress,
        rank: int = 0,
        put_on_device: bool = True,
        non_blocking: bool = False,
        gradient_state: Any = None,
        total_batch_size: int | None = None,
        total_dataset_length: int | None = None,
        use_stateful_dataloader: bool = False,
        **kwargs: Any,
    ) -> None:
        """`shard` does the index math, `progress` holds epoch and seed; `kwargs` go to torch's
        DataLoader. (The constructor keeps every argument so that `skip_first_batches` can build a twin.)"""
        self._worker_generator = torch.Generator()
        with warnings.catch_warnings():  # torchdata 0.11 warns about its own deprecated call
            warnings.filterwarnings("ignore", message=".*set_vital.*")
            super().__init__(dataset, generator=self._worker_generator, **kwargs)  # type: ignore[call-arg]
        self._shard, self._progress, self._rank, self.device = shard, progress, rank, device
        self._move = bool(put_on_device and device is not None and torch.device(device).type != "cpu")
        self._non_blocking = non_blocking
        self.gradient_state = gradient_state
        self._total_batch_size = total_batch_size
        self._total_dataset_length = total_dataset_length
        self._stateful = StatefulDataLoader is not None and isinstance(self, StatefulDataLoader)
        self.reset()

    # -- what subclasses provide ---------------------------------------------------------------
    def _source(self, start: int) -> tuple[Iterator[Any], Any]:
        """The pass's batches, and the DataLoader iterator whose workers the pass owns (or None)."""
        raise NotImplementedError

    def _full_length(self) -> int:
        return int(self._shard.full_length(self._rank))  # type: ignore[attr-defined]

    def _final_remainder(self) -> int:
        """Real samples of the pass's final batch when `even_batches` padded it, else 0 (-1: not known yet)."""
        rem = int(getattr(self._shard, "remainder", -1))  # type: ignore[attr-defined]
        if rem < 0 and self._total_dataset_length is not None:
            return sh_remainder(self._total_dataset_length, self._shard.spec)  # type: ignore[attr-defined]
        return rem

    def _apply_epoch(self, epoch: int) -> None:
        """Tell the sampler / dataset which epoch (and seed, after a restore) the coming pass uses."""
        shard = self._shard  # type: ignore[attr-defined]
        shard.set_epoch(epoch)  # its sampler's, or its iterable dataset's
        if shard is not self.dataset:  # type: ignore[attr-defined]  # map-style: as Accelerate, the dataset's too
            call_set_epoch(self.dataset, epoch)  # type: ignore[attr-defined]
        inner = getattr(getattr(shard, "batch_sampler", None), "sampler", None)
        if isinstance(inner, SeedableRandomSampler):
            inner.initial_seed = self._progress.seed

    def get_sampler(self) -> Any:
        """The index sampler (Accelerate's accessor)."""
        inner = getattr(self._shard, "batch_sampler", None)  # type: ignore[attr-defined]
        return getattr(inner, "sampler", inner)

    # -- public surface ------------------------------------------------------------------------
    def __len__(self) -> int:
        return max(self._full_length() - self._start, 0)

    @property
    def total_batch_size(self) -> int | None:
        """Samples per step over all processes."""
        return self._total_batch_size

    @property
    def total_dataset_length(self) -> int | None:
        return self._total_dataset_length

    @property
    def seed(self) -> int:
        return self._progress.seed

    @property
    def epoch(self) -> int:
        return self._progress.epoch

    @property
    def iteration(self) -> int:  # Accelerate's name for the epoch counter
        return self._progress.epoch

    @iteration.setter
    def iteration(self, value: int) -> None:
        self.set_epoch(value)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch of the next pass, and tell the samplers and dataset that have a
        `set_epoch` now (as Accelerate does). Shuffled without a generator of the user's, the
        pass's order is a function of (seed, epoch) only."""
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            raise ValueError(f"set_epoch({epoch!r}): the epoch must be an integer >= 0")
        self._progress.epoch = epoch
        self._apply_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        self._prepare_pass()
        self.begin()
        completed, base = False, None
        try:
            source, base = self._source(self._pass_start)
            yield from self._iterate(source)
            completed = True
        finally:
            if not self.persistent_workers:  # type: ignore[attr-defined]  # they serve the next pass
                _end_workers(base)
            self.end()
            self._start = self._skip_each_pass
            if completed:
                if self._progress.active is self:
                    self._progress.active = None
                self._open = False
                self._progress.epoch += 1
                self.batches_yielded = 0
                self._yield_state = None

    def _prepare_pass(self) -> None:
        self._synchronize_rngs()
        self._pass_start = self._start
        self._open = True
        self._progress.active = self
        epoch = self._progress.epoch
        self._apply_epoch(epoch)
        self._progress.start_pass(self._draws_base_seed())
        begin = getattr(self._shard, "begin_pass", None)  # type: ignore[attr-defined]
        if begin is not None:
            begin()
        gen = getattr(self, "_worker_generator", None)
        if gen is not None:
            gen.manual_seed(worker_seed(self._progress.seed, epoch, self._rank))

    def _synchronize_rngs(self) -> None:
        """Give every rank rank 0's global torch / device RNG state when `rng_types` names them,
        at each pass start as Accelerate does (so e.g. dropout draws agree across ranks). The
        user's shuffle generator ("generator") is aligned by `Progress.start_pass`."""
        others = [r for r in (self.rng_types or ()) if str(r) != "generator"]
        if others:
            synchronize_rng_states(others)

    def _draws_base_seed(self) -> bool:
        """Whether torch would draw a worker base seed from the loader's generator now: at every
        pass, but only once with persistent workers."""
        persistent = self.persistent_workers and self.num_workers > 0  # type: ignore[attr-defined]
        return not (persistent and getattr(self, "_iterator", None) is not None)

    def _base_pass(self, skip: int) -> Iterator[Any]:
        """A pass of the DataLoader under this loader, its shard skipping `skip` batches first:
        the iterator `_source` returns to `__iter__`, which ends its workers."""
        self._shard.skip = skip  # type: ignore[attr-defined]
        return open_watched(self, lambda: iter(super(PreparedLoaderMixin, self).__iter__()))  # type: ignore[misc]

    def _is_last(self, number: int) -> bool | None:
        """Whether batch `number` (from 1) of this pass is its last; None when only reading on
        can tell (the loader then loads one batch ahead to set `end_of_dataloader` in time)."""
        total = self._pass_batches
        return None if total is None else number >= total

    def _iterate(self, source: Iterator[Any]) -> Iterator[Any]:
        """Yield the pass's batches, flagging the last one as it is yielded.

        A pass whose length is known loads no batch ahead of the one the user holds: its memory
        is the one the previous batch just freed, still in the cache.
        """
        current = next(source, _END)
        self.remainder = self._final_remainder()
        if current is _END:
            self.end_of_dataloader = True
            return
        while True:
            snapshot = self._snapshot()
            last = self._is_last(self.batches_yielded + 1)
            nxt = next(source, _END) if last is None else _LATER
            self.batches_yielded += 1
            if last or nxt is _END:
                self.end_of_dataloader = True
                self.remainder = self._final_remainder()
            self._yield_state = snapshot
            yield send_to_device(current, self.device, self._non_blocking) if self._move else current  # type: ignore[arg-type]
            if nxt is _LATER:  # after a known last batch, this ends the source (a receiver's end message)
                nxt = next(source, _END)
            if nxt is _END:
                return
            current = nxt

    def _clone_from(self, start: int) -> PreparedLoaderMixin:
        """A loader over the same data, sharing epoch and seed, whose next pass starts at batch `start`."""
        prepared = self._ctor  # type: ignore[attr-defined]
        view = type(self)(prepared["dataset"], _prepared=prepared)
        view._start = start
        view.rng_types = self.rng_types
        # The view now owns the resumed position: the original's next pass starts a fresh epoch.
        self._start = self._skip_each_pass
        self._pending_state = None
        return view

    # -- checkpointing ---------------------------------------------------------------------------
    def _snapshot(self) -> Any:
        """State of the underlying loader right after the current batch (stateful loaders only)."""
        return StatefulDataLoader.state_dict(self) if self._stateful else None  # type: ignore[arg-type]

    def _position(self) -> int:
        return self._pass_start + self.batches_yielded if self._open else self._start

    def state_dict(self) -> dict[str, Any]:
        """Epoch, position in it and seed (plus torchdata's own state for a stateful loader).

        A skip view and its original share one epoch; whichever is iterating reports the position.
        """
        active = self._progress.active
        if active is not None and active is not self and type(active) is type(self):
            return active.state_dict()
        state: dict[str, Any] = {
            "version": STATE_VERSION,
            "epoch": self._progress.epoch,
            "batches": self._position(),
            "seed": self._progress.seed,
        }
        gen = self._progress.generator
        if gen is not None:  # the order's source: its state when this pass (or the next) began
            pass_state = self._progress.pass_state
            state["generator"] = pass_state if self._open and pass_state is not None else gen.get_state()
        if self._stateful:
            inner = self._yield_state if self._open else self._pending_state
            state["loader"] = inner if inner is not None else StatefulDataLoader.state_dict(self)  # type: ignore[arg-type]
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume: the next pass yields exactly the batches the saved loader had not yet yielded."""
        missing = {"epoch", "batches", "seed"} - set(state_dict)
        if missing:
            raise ValueError(f"load_state_dict: not a prepared-loader state, missing {sorted(missing)}")
        self._progress.active = None
        self._progress.epoch = int(state_dict["epoch"])
        self._progress.seed = int(state_dict["seed"])
        self._start = int(state_dict["batches"])
        self._open = False
        self._yield_state = None
        gen = self._progress.generator
        if gen is not None and state_dict.get("generator") is not None:
            gen.set_state(state_dict["generator"])
        elif gen is not None:
            warnings.warn(
                "load_state_dict: this loader takes its order from your generator, but the state holds "
                "none (saved by a loader that shuffles by (seed, epoch)): the resumed order is the "
                "generator's current one, not the saved run's",
                stacklevel=2,
            )
        if self._stateful and state_dict.get("loader") is not None:
            self._pending_state = state_dict["loader"]
            StatefulDataLoader.load_state_dict(self, state_dict["loader"])  # type: ignore[arg-type]


class DataLoaderShard(PreparedLoaderMixin, DataLoader):  # type: ignore[misc]
    """This process's share of a DataLoader, as a DataLoader (Accelerate's name).

    `_shard` is the `BatchSamplerShard` or `IterableDatasetShard` doing the index math; the
    DataLoader machinery (workers, collate, pin memory) is torch's, untouched.
    """

    def __init__(
        self,
        dataset: Any,
        device: torch.device | None = None,
        rng_types: list[Any] | None = None,
        synchronized_generator: torch.Generator | None = None,
        skip_batches: int = 0,
        use_stateful_dataloader: bool = False,
        _drop_last: bool = False,
        _non_blocking: bool = False,
        torch_device_mesh: Any = None,
        iteration: int = 0,
        *,
        _prepared: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Accelerate's signature: built directly, a one-process loader over `DataLoader(dataset,
        **kwargs)` that moves its batches to `device`; `prepare_data_loader` passes `_prepared`.
        A `synchronized_generator` (with "generator" in `rng_types`) is synchronised at each pass
        and saved with the state, as the sampler's own generator is."""
        if _prepared is None:
            _prepared = self._direct(
                dataset, kwargs, device=device, non_blocking=_non_blocking, stateful=use_stateful_dataloader
            )
        self._setup(**_prepared)
        self._ctor = _prepared
        if synchronized_generator is not None and "generator" in (rng_types or ()):
            if self._progress.generator is None:
                self._progress.generator = synchronized_generator
        self._accelerate_args(
            skip_batches,
            iteration,
            rng_types=rng_types,
            synchronized_generator=synchronized_generator,
            use_stateful_dataloader=bool(_prepared.get("use_stateful_dataloader")),
            _drop_last=_drop_last,
            torch_device_mesh=torch_device_mesh,
        )

    @property
    def even_batches(self) -> bool:
        return bool(self._shard.even_batches)

    @even_batches.setter
    def even_batches(self, value: bool) -> None:
        """Takes effect on the next pass (`join_uneven_inputs` flips it for evaluation)."""
        self._shard.even_batches = bool(value)

    def _source(self, start: int) -> tuple[Iterator[Any], Any]:
        restoring = self._stateful and self._pending_state is not None
        self._pending_state = None
        inner = self._base_pass(0 if restoring else start)
        # torchdata fast-forwards a restored iterator itself: only a fresh one has the shard's count
        self._pass_batches = None if restoring else getattr(self._shard, "pass_batches", None)
        return inner, inner


if StatefulDataLoader is not None:

    class StatefulDataLoaderShard(DataLoaderShard, StatefulDataLoader):  # type: ignore[misc,valid-type]
        """`DataLoaderShard` backed by torchdata's `StatefulDataLoader` (`use_stateful_dataloader=True`)."""

    DataLoaderShard._stateful_twin = StatefulDataLoaderShard

else:  # pragma: no cover
    StatefulDataLoaderShard = None  # type: ignore[assignment,misc]
