"""Samplers and dataset wrappers that apply `sharding` to a torch DataLoader's index stream.

They only compute indices: no sample is loaded here, so skipping batches costs index arithmetic.
"""

from __future__ import annotations

from collections.abc import Iterator, Sized
from typing import Any

import torch
from torch.utils.data import BatchSampler, IterableDataset, RandomSampler, Sampler

from accelerando.data import sharding as sh

try:  # torchdata's stateful BatchSampler batches exactly like torch's
    from torchdata.stateful_dataloader.sampler import BatchSampler as _TorchdataBatchSampler

    _PLAIN_BATCH_ITERS: tuple[Any, ...] = (BatchSampler.__iter__, _TorchdataBatchSampler.__iter__)
except ImportError:  # pragma: no cover - torchdata is optional
    _PLAIN_BATCH_ITERS = (BatchSampler.__iter__,)


def is_plain_batch_sampler(batch_sampler: Any) -> bool:
    """True for a torch `BatchSampler` (not a subclass that changes how batches are formed)."""
    return (
        isinstance(batch_sampler, BatchSampler)
        and type(batch_sampler).__iter__ in _PLAIN_BATCH_ITERS
        and isinstance(getattr(batch_sampler, "sampler", None), Sized)
    )


class SeedableRandomSampler(RandomSampler):
    """A `RandomSampler` whose order is a function of `(initial_seed, epoch)` only.

    It never draws from the global torch RNG (so the training loop's randomness is not shifted by
    iterating data) and never touches a generator the user passed. The order for a given
    `data_seed` and epoch is the one Accelerate's sampler of the same name gives, and, as there, a
    complete pass moves on to the next epoch (a pass stopped early does not), until someone calls
    `set_epoch`: from then on the caller chooses every epoch (prepared loaders do, before each
    pass, so that re-iterating to fast-forward a resumed pass gives that pass's order again).
    """

    def __init__(self, *args: Any, data_seed: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.initial_seed = int(torch.initial_seed() if data_seed is None else data_seed)
        self.epoch = 0
        self._epochs_chosen = False

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)
        self._epochs_chosen = True

    def __iter__(self) -> Iterator[int]:
        if getattr(self, "_epochs_chosen", False):  # (pickled before this attribute existed)
            return iter(self.order())  # a list's iterator: `list(sampler)` copies it at C speed
        return self._advancing()

    def _advancing(self) -> Iterator[int]:
        """The order, then the next epoch once the pass is complete."""
        yield from self.order()
        self.epoch += 1

    def order(self) -> list[int]:
        """The epoch's whole order at once (a generator yielding index by index costs 3% of an epoch)."""
        n = len(self.data_source)  # type: ignore[arg-type]
        gen = torch.Generator()
        gen.manual_seed(self.initial_seed + self.epoch)
        total = self.num_samples
        if self.replacement:
            out: list[int] = []
            for _ in range(total // 32):
                out += torch.randint(high=n, size=(32,), dtype=torch.int64, generator=gen).tolist()
            return out + torch.randint(high=n, size=(total % 32,), dtype=torch.int64, generator=gen).tolist()
        # torch's RandomSampler draws one more permutation even when `n` divides `total`; it comes
        # after every index used, so leaving it out changes no order and halves the cost of a pass
        perms = [torch.randperm(n, generator=gen) for _ in range(total // n)]
        if total % n:
            perms.append(torch.randperm(n, generator=gen)[: total % n])
        return torch.cat(perms).tolist()  # never empty: RandomSampler refuses num_samples < 1


def call_set_epoch(obj: Any, epoch: int) -> None:
    fn = getattr(obj, "set_epoch", None)
    if callable(fn):
        fn(epoch)


class BatchSamplerShard(Sampler[list[int]]):
    """One process's batches of a batch sampler (see `sharding` for the exact assignment).

    A torch `BatchSampler` is sharded by index arithmetic over its sampler's order; any other
    batch sampler is kept as it is and its batches are dealt round-robin (or split, with
    `split_batches`). `skip` batches at the start of the next pass are jumped over, never loaded.
    """

    def __init__(
        self,
        batch_sampler: Any,
        num_processes: int = 1,
        process_index: int = 0,
        split_batches: bool = False,
        even_batches: bool = True,
    ) -> None:
        self.batch_sampler = batch_sampler
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        self.even_batches = even_batches
        self.batch_size: int | None = getattr(batch_sampler, "batch_size", None)
        self.drop_last: bool = bool(getattr(batch_sampler, "drop_last", False))
        self.plain = is_plain_batch_sampler(batch_sampler)
        if split_batches and self.batch_size is None and not self.plain:
            raise ValueError(
                "split_batches=True needs a batch sampler with a `batch_size` attribute (the global "
                f"batch size); {type(batch_sampler).__name__} has none"
            )
        _ = self.spec  # validates the arguments
        self.skip = 0
        self.remainder = -1
        self.pass_batches: int | None = None  # batches the pass begun last yields, when its start knows
        self._pass_order: list[int] | None = None
        self._in_pass = False

    def begin_pass(self) -> None:
        """A prepared loader's pass begins: its order is drawn once, however often torch (or
        torchdata, restoring) calls `iter` on this sampler during the pass. Drawing it twice would
        take two orders from a user's generator."""
        self._pass_order = None
        self._in_pass = True

    def pass_order(self) -> list[int]:
        """The wrapped sampler's indices for this pass (drawn anew on each call outside a pass)."""
        if self._in_pass and self._pass_order is not None:
            return self._pass_order
        order = list(self.batch_sampler.sampler)
        if self._in_pass:
            self._pass_order = order
        return order

    @property
    def spec(self) -> sh.ShardSpec:
        return sh.ShardSpec(
            self.process_index,
            self.num_processes,
            self.batch_size or 1,
            self.split_batches,
            self.even_batches,
            self.drop_last,
        )

    @property
    def total_length(self) -> int:
        """Batches of the wrapped sampler (all processes together)."""
        return len(self.batch_sampler)

    def set_epoch(self, epoch: int) -> None:
        call_set_epoch(self.batch_sampler, epoch)
        call_set_epoch(getattr(self.batch_sampler, "sampler", None), epoch)

    def full_length(self, rank: int | None = None) -> int:
        """Batches of this process (or of `rank`) in a whole epoch, ignoring `skip`."""
        spec = self.spec if rank is None else self.spec.for_rank(rank)
        if self.plain:
            return sh.num_batches(len(self.batch_sampler.sampler), spec)
        if self.split_batches:
            return len(self.batch_sampler)
        return sh.round_robin_len(len(self.batch_sampler), spec)

    def __len__(self) -> int:
        return max(self.full_length() - self.skip, 0)

    def __iter__(self) -> Iterator[list[int]]:
        spec, skip = self.spec, self.skip
        if self.plain:
            indices = self.pass_order()
            self.remainder = sh.remainder(len(indices), spec)
            self.pass_batches = max(sh.num_batches(len(indices), spec) - skip, 0)
            return sh.iter_rank_batches(indices, spec, skip)
        self.remainder = 0
        self.pass_batches = None  # a custom batch sampler's length is only its word
        return self._iter_custom(spec, skip)

    def _iter_custom(self, spec: sh.ShardSpec, skip: int) -> Iterator[list[int]]:
        sink: list[int] = []
        if self.split_batches:
            stream = sh.iter_split(self.batch_sampler, spec, skip, sink, full_size=self.batch_size)
            for piece in stream:
                if sink:
                    self.remainder = sink[0]
                yield piece
        else:
            for batch, _ in sh.iter_round_robin(self.batch_sampler, spec, skip, sink):
                if sink:
                    self.remainder = sink[0]
                yield list(batch)


class IterableDatasetShard(IterableDataset):
    """One process's samples of an iterable dataset: every process reads the stream, keeps its piece.

    The stream is cut in global batches of `batch_size * num_processes` samples (`batch_size` when
    `split_batches`); a short final one is padded from the first samples (`even_batches`),
    dropped (`drop_last`) or shared as it is. `skip` global batches are read and discarded.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int = 1,
        drop_last: bool = False,
        num_processes: int = 1,
        process_index: int = 0,
        split_batches: bool = False,
        even_batches: bool = True,
    ) -> None:
        self.dataset = dataset
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        self.even_batches = even_batches
        _ = self.spec  # validates the arguments
        self.skip = 0
        self.remainder = -1
        self.epoch = 0

    @property
    def spec(self) -> sh.ShardSpec:
        return sh.ShardSpec(
            self.process_index,
            self.num_processes,
            self.batch_size,
            self.split_batches,
            self.even_batches,
            self.drop_last,
        )

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        call_set_epoch(self.dataset, epoch)

    @property
    def total_length(self) -> int:
        return len(self.dataset)

    def __len__(self) -> int:
        spec = self.spec
        return max(sh.num_samples_of_rank(len(self.dataset), spec) - self.skip * spec.per_rank, 0)

    @property
    def loader_batch_size(self) -> int:
        """The batch size of the DataLoader reading this dataset."""
        return self.spec.per_rank

    def full_length(self, rank: int | None = None) -> int:
        """Batches of this process (or of `rank`) in a whole epoch, ignoring `skip`."""
        spec = self.spec if rank is None else self.spec.for_rank(rank)
        return -(-sh.num_samples_of_rank(len(self.dataset), spec) // spec.per_rank)

    def __iter__(self) -> Iterator[Any]:
        spec = self.spec
        self.remainder = -1
        for chunk, real in sh.iter_global_batches(self.dataset, spec, self.skip):
            if real < len(chunk):
                self.remainder = real
            elif self.remainder < 0 and len(chunk) < spec.global_size:
                self.remainder = 0
            bounds = sh.piece_bounds(len(chunk), spec)
            if bounds is not None:
                yield from chunk[bounds[0] : bounds[1]]
        if self.remainder < 0:
            self.remainder = 0
