"""Pure index math for splitting one epoch of data across processes (no torch, no processes).

Two models cover every loader `prepare` builds:

* **Element model** (a torch `BatchSampler`, an `IterableDataset`): the epoch's sample stream is
  cut into *global batches* of `G = per_rank * world_size` samples; rank `r` takes the contiguous
  piece `[r * per_rank, (r + 1) * per_rank)` of each. A short final global batch is dropped
  (`drop_last`), completed with samples from the start of the epoch (`even_batches`), or split as
  it is (some ranks get a short piece or none). Same batches as Accelerate's `BatchSamplerShard`.
* **Round-robin model** (a user's own batch sampler, whose batches are kept as they are): batch
  `i` goes to rank `i % world_size`; `even_batches` completes the final round with whole batches
  from the start of the epoch, `drop_last` drops it.

Every function here is a plain function of its arguments; `tests/unit/data` checks each against a
brute-force simulation for every (rank, world, split, even, drop_last) combination.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class ShardSpec:
    """How one rank's share of an epoch is cut.

    `batch_size` is what the user gave the DataLoader: per process, or global when `split_batches`.
    """

    rank: int
    world_size: int
    batch_size: int
    split_batches: bool = False
    even_batches: bool = True
    drop_last: bool = False

    def __post_init__(self) -> None:
        if self.world_size == 1:  # one process has nobody to be even with: never pad
            object.__setattr__(self, "even_batches", False)
        if not isinstance(self.world_size, int) or self.world_size < 1:
            raise ValueError(f"world_size={self.world_size!r} must be an integer >= 1")
        if not isinstance(self.rank, int) or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank={self.rank!r} must be an integer in [0, {self.world_size})")
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"batch_size={self.batch_size!r} must be an integer >= 1")
        if self.split_batches and self.batch_size % self.world_size != 0:
            raise ValueError(  # Accelerate's words first: code and tests match on them
                f"To use a `DataLoader` in `split_batches` mode, the batch size ({self.batch_size}) "
                f"needs to be a round multiple of the number of processes ({self.world_size}). "
                f"split_batches=True cuts each batch of batch_size={self.batch_size} into "
                f"{self.world_size} equal pieces; use a multiple of {self.world_size} or split_batches=False"
            )

    @property
    def per_rank(self) -> int:
        """Samples in one full batch of one rank."""
        return self.batch_size // self.world_size if self.split_batches else self.batch_size

    @property
    def global_size(self) -> int:
        """Samples in one full global batch (all ranks, one step): `total_batch_size`."""
        return self.per_rank * self.world_size

    def for_rank(self, rank: int) -> ShardSpec:
        return ShardSpec(
            rank, self.world_size, self.batch_size, self.split_batches, self.even_batches, self.drop_last
        )


# ---------------------------------------------------------------------------------------------
# Element model over a known-length sequence of indices (map-style data)
# ---------------------------------------------------------------------------------------------


def num_batches(num_samples: int, spec: ShardSpec) -> int:
    """Batches rank `spec.rank` gets in an epoch of `num_samples` samples (element model)."""
    full, rest = divmod(num_samples, spec.global_size)
    if rest == 0 or spec.drop_last:
        return full
    if spec.even_batches:
        return full + 1
    return full + (1 if spec.rank * spec.per_rank < rest else 0)


def remainder(num_samples: int, spec: ShardSpec) -> int:
    """Real samples in the final global batch when `even_batches` padded it, else 0."""
    rest = num_samples % spec.global_size
    return rest if (rest and spec.even_batches and not spec.drop_last) else 0


def padding(indices: Sequence[T], count: int) -> list[T]:
    """`count` samples taken from the start of the epoch, cycling when the epoch is shorter."""
    if count <= 0:
        return []
    if not indices:
        raise ValueError("cannot pad an empty epoch")
    reps = -(-count // len(indices))
    if reps == 1:
        return list(indices[:count])
    return (list(indices) * reps)[:count]


def rank_batch(indices: Sequence[T], spec: ShardSpec, k: int) -> list[T]:
    """The `k`-th batch of rank `spec.rank` (O(batch size); used to skip without iterating)."""
    g, p = spec.global_size, spec.per_rank
    start = k * g + spec.rank * p
    n = len(indices)
    if start + p <= n:
        return list(indices[start : start + p])
    # the final, short global batch
    if spec.even_batches and not spec.drop_last:
        real = list(indices[start:n]) if start < n else []
        pad_from = max(start - n, 0)
        return real + padding(indices, pad_from + p - len(real))[pad_from:]
    return list(indices[start:n])


def iter_rank_batches(indices: Sequence[T], spec: ShardSpec, start: int = 0) -> Iterator[list[T]]:
    """Rank `spec.rank`'s batches of the epoch `indices`, from batch `start` (O(1) skip)."""
    total = num_batches(len(indices), spec)
    g, p, n = spec.global_size, spec.per_rank, len(indices)
    k = max(start, 0)
    offset = k * g + spec.rank * p
    full = n // g
    while k < min(total, full):  # fast path: full global batches are plain slices
        yield list(indices[offset : offset + p])
        offset += g
        k += 1
    while k < total:
        yield rank_batch(indices, spec, k)
        k += 1


# ---------------------------------------------------------------------------------------------
# Element model over a stream of unknown length (iterable datasets, dispatch)
# ---------------------------------------------------------------------------------------------


def iter_global_batches(stream: Iterable[T], spec: ShardSpec, skip: int = 0) -> Iterator[tuple[list[T], int]]:
    """Cut `stream` into global batches; yield `(batch, real)` where `real` < len(batch) means padded.

    The first `skip` global batches are read but not yielded (an iterable cannot jump ahead).
    A short final batch is dropped, padded from the epoch's first samples, or yielded short.
    """
    g = spec.global_size
    it = iter(stream)
    head: list[T] = []  # the epoch's first global batch, for padding
    k = 0
    while True:
        chunk = list(islice(it, g))
        if not head:
            head = chunk
        if len(chunk) < g:
            break
        if k >= skip:
            yield chunk, g
        k += 1
    if not chunk or spec.drop_last or k < skip:
        return
    real = len(chunk)
    if spec.even_batches:
        chunk = chunk + padding(head, g - real)
    yield chunk, real


def piece_bounds(batch_len: int, spec: ShardSpec, rank: int | None = None) -> tuple[int, int] | None:
    """Slice `[start, stop)` of a global batch of `batch_len` samples for `rank`, or None if empty."""
    r = spec.rank if rank is None else rank
    start = r * spec.per_rank
    if start >= batch_len:
        return None
    return start, min(start + spec.per_rank, batch_len)


def iter_rank_stream(stream: Iterable[T], spec: ShardSpec, skip: int = 0) -> Iterator[T]:
    """The samples of rank `spec.rank`, in order (what `IterableDatasetShard` yields)."""
    for chunk, _ in iter_global_batches(stream, spec, skip):
        bounds = piece_bounds(len(chunk), spec)
        if bounds is not None:
            yield from chunk[bounds[0] : bounds[1]]


# ---------------------------------------------------------------------------------------------
# Round-robin model (custom batch samplers: batches are never resized)
# ---------------------------------------------------------------------------------------------


def round_robin_len(num_source_batches: int, spec: ShardSpec) -> int:
    """Batches of rank `spec.rank` when `num_source_batches` are dealt round-robin."""
    full, rest = divmod(num_source_batches, spec.world_size)
    if rest == 0 or spec.drop_last:
        return full
    if spec.even_batches:
        return full + 1
    return full + (1 if spec.rank < rest else 0)


def iter_rounds(
    batches: Iterable[Sequence[Any]], spec: ShardSpec, skip: int = 0, sink: list[int] | None = None
) -> Iterator[tuple[list[Sequence[Any]], int]]:
    """Group `batches` in rounds of `world_size` (one per rank); yield `(round, real)` from round `skip`.

    The final, incomplete round is dropped (`drop_last`), completed with whole batches from the
    start of the epoch (`even_batches`; `real` counts the batches that are not padding, and the
    real samples of that round are appended to `sink`), or yielded short.
    """
    n = spec.world_size
    head: list[Sequence[Any]] = []
    round_: list[Sequence[Any]] = []
    k = 0
    for batch in batches:
        if len(head) < n:
            head.append(batch)
        round_.append(batch)
        if len(round_) == n:
            if k >= skip:
                yield round_, n
            k += 1
            round_ = []
    if not round_ or spec.drop_last or k < skip:
        return
    real = len(round_)
    if spec.even_batches:
        if sink is not None:
            sink.append(sum(len(b) for b in round_))
        round_ = round_ + [head[i % len(head)] for i in range(n - real)]
    yield round_, real


def iter_round_robin(
    batches: Iterable[Sequence[Any]], spec: ShardSpec, skip: int = 0, sink: list[int] | None = None
) -> Iterator[tuple[Sequence[Any], bool]]:
    """Rank `spec.rank`'s batches when `batches` are dealt round-robin: `(batch, is_padding)`."""
    r = spec.rank
    for round_, real in iter_rounds(batches, spec, skip, sink):
        if r < len(round_):
            yield round_[r], r >= real


def split_batch_len(batch_len: int, spec: ShardSpec) -> int:
    """Per-rank piece size when one batch of `batch_len` samples is split across ranks."""
    if batch_len % spec.world_size:
        raise ValueError(
            f"split_batches=True: a batch of {batch_len} samples cannot be split evenly across "
            f"{spec.world_size} processes; make the batch sampler yield multiples of {spec.world_size}"
        )
    return batch_len // spec.world_size


def iter_split(
    batches: Iterable[Sequence[Any]],
    spec: ShardSpec,
    skip: int = 0,
    sink: list[int] | None = None,
    full_size: int | None = None,
) -> Iterator[list[Any]]:
    """Split each batch of a custom batch sampler in `world_size` contiguous pieces; take ours.

    Every batch but the last must divide evenly. The last, if shorter than `full_size` (default: the
    first batch's length), is padded from the epoch's first batch (`even_batches`), dropped
    (`drop_last`) or cut as it is.
    """
    first: list[Any] | None = None
    full = full_size
    for k, batch in enumerate(batches):
        if first is None:
            first = list(batch)
            full = len(first) if full is None else full
            split_batch_len(full, spec)
        assert full is not None
        if len(batch) >= full:
            if k >= skip:
                piece = split_batch_len(len(batch), spec)
                yield list(batch[spec.rank * piece : (spec.rank + 1) * piece])
            continue
        if spec.drop_last or k < skip:  # a short batch: it must be the last one
            return
        size = full // spec.world_size
        if spec.even_batches:
            if sink is not None:
                sink.append(len(batch))
            batch = list(batch) + padding(first, full - len(batch))
        piece_ = batch[spec.rank * size : (spec.rank + 1) * size]
        if piece_:
            yield list(piece_)
        return


def num_samples_of_rank(num_samples: int, spec: ShardSpec) -> int:
    """Samples (padding included) rank `spec.rank` gets in an epoch of `num_samples` (element model)."""
    full, rest = divmod(num_samples, spec.global_size)
    count = full * spec.per_rank
    if rest and not spec.drop_last:
        if spec.even_batches:
            count += spec.per_rank
        else:
            count += max(0, min(spec.per_rank, rest - spec.rank * spec.per_rank))
    return count
