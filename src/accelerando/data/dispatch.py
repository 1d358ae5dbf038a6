"""`dispatch_batches=True`: rank 0 reads the data and sends each rank only its own piece.

Rank 0 loads every rank's batch and hands it to `transport` (receivers on its host copy it out of
rank 0's memory; others get it over gloo), at most a few batches ahead of each receiver, and none
when the pass's length is known.
Ranks get exactly the batches the non-dispatch sharding gives them (`sharding`), including a short
or missing final batch. As in Accelerate, with `split_batches=True` rank 0 collates the whole
step's batch once and slices it (`slice_fn_for_dispatch`); otherwise it collates each rank's batch
on its own, as that rank would without dispatch (so a padding collator pads per rank, and batches
of different lengths need no concatenation). A dataset that yields whole batches (`batch_size=None`)
has its batches dealt whole (`WholeBatchShard`, `WholeBatchStream`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from itertools import islice, zip_longest
from typing import Any

import torch
from torch.utils.data import DataLoader

from accelerando.data import heap
from accelerando.data import sharding as sh
from accelerando.data.loaders import DataLoaderShard, PreparedLoaderMixin, StatefulDataLoader
from accelerando.data.samplers import BatchSamplerShard, IterableDatasetShard
from accelerando.data.transport import MORE, UNKNOWN, Channel, EndMsg


def batch_length(batch: Any) -> int:
    """Samples in a collated batch: first dimension of its first tensor, else length of a list of values."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, Mapping):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        if batch and all(not isinstance(x, (torch.Tensor, Mapping, list, tuple)) for x in batch):
            return len(batch)
        for item in batch:
            n = batch_length(item)
            if n >= 0:
                return n
    return -1


def slice_batch(batch: Any, piece: slice, size: int) -> Any:
    """Default `slice_fn_for_dispatch`: cut every tensor and every list of plain values of length `size`."""
    if isinstance(batch, torch.Tensor):
        return batch[piece] if batch.dim() and batch.shape[0] == size else batch
    if isinstance(batch, Mapping):
        return type(batch)({k: slice_batch(v, piece, size) for k, v in batch.items()})  # type: ignore[call-arg]
    if isinstance(batch, (list, tuple)):
        plain = all(not isinstance(x, (torch.Tensor, Mapping, list, tuple)) for x in batch)
        items = (
            list(batch[piece])
            if plain and len(batch) == size
            else [slice_batch(x, piece, size) for x in batch]
        )
        return type(batch)(*items) if hasattr(batch, "_fields") else type(batch)(items)
    return batch


class DispatchBatchSampler(BatchSamplerShard):
    """Rank 0's index stream: whole global batches (torch `BatchSampler` with `split_batches`), else
    each rank's batch in rank order, one round after another (a custom batch sampler is kept)."""

    pass_counts: list[int] | None = None  # each rank's batches in the pass begun last, when its start knew

    @property
    def global_batches(self) -> bool:
        """True when rank 0 loads whole global batches and slices them."""
        return bool(self.plain and self.split_batches)

    def __len__(self) -> int:
        if self.global_batches:  # rank 0 always has the most
            return max(self.full_length(0) - self.skip, 0)
        return sum(max(self.full_length(r) - self.skip, 0) for r in range(self.num_processes))

    def __iter__(self) -> Iterator[list[int]]:
        spec, skip = self.spec, self.skip
        self.remainder = 0
        self.pass_counts = None
        if self.plain:
            indices = self.pass_order()
            self.remainder = sh.remainder(len(indices), spec)
            self.pass_counts = [
                max(sh.num_batches(len(indices), spec.for_rank(r)) - skip, 0)
                for r in range(self.num_processes)
            ]
            chunks = (chunk for chunk, _ in sh.iter_global_batches(indices, spec, skip))
            return chunks if self.global_batches else _pieces(chunks, spec)
        return self._iter_rounds(spec, skip)

    def _iter_rounds(self, spec: sh.ShardSpec, skip: int) -> Iterator[list[int]]:
        sink: list[int] = []
        if self.split_batches:
            per_rank = [
                sh.iter_split(
                    self.batch_sampler, spec.for_rank(r), skip, sink if r == 0 else None, self.batch_size
                )
                for r in range(self.num_processes)
            ]
            rounds: Iterator[Any] = (
                ([b for b in rnd if b is not None], 0) for rnd in zip_longest(*per_rank, fillvalue=None)
            )
        else:
            rounds = sh.iter_rounds(self.batch_sampler, spec, skip, sink)
        for round_, _ in rounds:
            if sink:
                self.remainder = sink[0]
            yield from (list(b) for b in round_)


def _pieces(chunks: Iterator[list[Any]], spec: sh.ShardSpec) -> Iterator[list[Any]]:
    """Each global batch cut into the ranks' batches, in rank order (empty pieces left out)."""
    for chunk in chunks:
        for r in range(spec.world_size):
            bounds = sh.piece_bounds(len(chunk), spec, r)
            if bounds is not None:
                yield chunk[bounds[0] : bounds[1]]


class GlobalBatchDataset(IterableDatasetShard):
    """Rank 0's view of an iterable dataset: every global batch of the stream (padded or short).

    Rank 0's loader batches it by the global size (`split_batches`) or by the per-rank size, which
    cuts each global batch into the ranks' batches in rank order.
    """

    @property
    def global_batches(self) -> bool:
        return self.split_batches

    @property
    def loader_batch_size(self) -> int:
        return self.spec.global_size if self.split_batches else self.spec.per_rank

    def __iter__(self) -> Iterator[Any]:
        self.remainder = 0
        for chunk, real in sh.iter_global_batches(self.dataset, self.spec, self.skip):
            if real < len(chunk):
                self.remainder = real
            yield from chunk


class WholeBatchShard(IterableDatasetShard):
    """This rank's share of an iterable dataset that yields whole batches (a DataLoader with
    `batch_size=None`): each item is one rank's batch, dealt in rounds in rank order (a short last
    round is completed with the pass's first batches under `even_batches`); with `split_batches`
    each item is one step's batch, cut in equal pieces. Every rank reads the whole stream.
    """

    def __init__(self, dataset: Any, num_processes: int, process_index: int, split: bool, even: bool) -> None:
        super().__init__(dataset, num_processes, False, num_processes, process_index, split, even)
        self.batch_size = None  # type: ignore[assignment]  # unknown: the dataset makes the batches

    @property
    def spec(self) -> sh.ShardSpec:
        n = self.num_processes
        return sh.ShardSpec(self.process_index, n, n, self.split_batches, self.even_batches, False)

    def spec_for(self, batch_len: int) -> sh.ShardSpec:
        """The ranks' pieces of one batch of `batch_len` samples (split mode): equal, or an error."""
        n = self.num_processes
        return sh.ShardSpec(self.process_index, n, batch_len, True, self.even_batches, False)

    @property
    def loader_batch_size(self) -> None:  # type: ignore[override]
        return None

    @property
    def total_length(self) -> int:
        return len(self.dataset)

    def full_length(self, rank: int | None = None) -> int:
        spec = self.spec if rank is None else self.spec.for_rank(rank)
        return len(self.dataset) if self.split_batches else sh.round_robin_len(len(self.dataset), spec)

    def __len__(self) -> int:
        return max(self.full_length() - self.skip, 0)

    def __iter__(self) -> Iterator[Any]:
        self.remainder = 0
        if not self.split_batches:
            yield from (batch for batch, _ in sh.iter_round_robin(self.dataset, self.spec, self.skip))
            return
        for batch in islice(self.dataset, self.skip, None):
            size = batch_length(batch)
            bounds = sh.piece_bounds(size, self.spec_for(size))
            if bounds is not None:
                yield slice_batch(batch, slice(*bounds), size)


class WholeBatchStream(WholeBatchShard):
    """Rank 0's view of a dataset of whole batches under dispatch: every rank's batches, in rank
    order, round after round (with `split_batches`: each batch whole, cut when sent)."""

    @property
    def global_batches(self) -> bool:
        return self.split_batches

    def __len__(self) -> int:
        return max(len(self.dataset) - self.skip * (1 if self.split_batches else self.num_processes), 0)

    def __iter__(self) -> Iterator[Any]:
        self.remainder = 0
        if self.split_batches:
            yield from islice(self.dataset, self.skip, None)
            return
        for round_, _ in sh.iter_rounds(self.dataset, self.spec, self.skip):
            yield from round_


class DataLoaderDispatcher(PreparedLoaderMixin, DataLoader):  # type: ignore[misc]
    """A prepared loader whose rank 0 reads everything and sends each rank its batch (Accelerate's name)."""

    def __init__(
        self,
        dataset: Any,
        split_batches: bool = False,
        skip_batches: int = 0,
        use_stateful_dataloader: bool = False,
        _drop_last: bool = False,
        _non_blocking: bool = False,
        slice_fn: Callable[..., Any] | None = None,
        torch_device_mesh: Any = None,
        iteration: int = 0,
        *,
        _prepared: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Accelerate's signature: built directly, rank 0 reads `DataLoader(dataset, **kwargs)` and
        every process of `PartialState()` gets its piece (a collective: every rank builds one);
        `prepare_data_loader` passes `_prepared`."""
        if _prepared is None:
            _prepared = self._direct(
                dataset,
                kwargs,
                dispatch=True,
                split_batches=split_batches,
                non_blocking=_non_blocking,
                stateful=use_stateful_dataloader,
                slice_fn=slice_fn,
            )
        self._setup(**_prepared)
        self._ctor = _prepared
        self._accelerate_args(
            skip_batches,
            iteration,
            split_batches=bool(self._shard.split_batches),
            use_stateful_dataloader=bool(_prepared.get("use_stateful_dataloader")),
            _drop_last=_drop_last,
            torch_device_mesh=torch_device_mesh,
        )

    def _setup(  # type: ignore[override]
        self,
        dataset: Any,
        device: torch.device | None = None,
        *,
        channel: Channel,
        slice_fn: Callable[..., Any] | None,
        world_size: int = 1,
        **kwargs: Any,
    ) -> None:
        super()._setup(dataset, device, **kwargs)
        self._world = world_size
        self._slice_fn = slice_fn
        self._channel = channel
        self._remote_remainder = -1
        self._mark = UNKNOWN  # what rank 0 said of the batches after the one received last

    even_batches = DataLoaderShard.even_batches

    def _final_remainder(self) -> int:
        return super()._final_remainder() if self._rank == 0 else self._remote_remainder

    def _snapshot(self) -> Any:
        return super()._snapshot() if self._rank == 0 else None

    def _is_last(self, number: int) -> bool | None:
        """Rank 0 counts (when the pass's start knew the counts); a receiver is told by rank 0.

        Both then read no batch ahead, and rank 0 sends each receiver its batch of a step before
        the step: a receiver never waits for a batch rank 0 would send only after a collective
        that waits for the receiver.
        """
        if self._rank != 0:
            return None if self._mark == UNKNOWN else self._mark != MORE
        return super()._is_last(number)

    def _source(self, start: int) -> tuple[Iterator[Any], Any]:
        restoring = self._stateful and self._pending_state is not None
        self._pending_state = None
        self._channel.begin_pass()
        if self._rank != 0:
            return self._receive(), None
        inner = self._base_pass(0 if restoring else start)
        counts = None if restoring else getattr(self._shard, "pass_counts", None)  # none for a stream
        self._pass_batches = None if counts is None else counts[0]
        return self._produce(inner, self._shard.global_batches, counts), inner

    def _receive(self) -> Iterator[Any]:
        self._remote_remainder = -1
        self._mark = UNKNOWN
        while True:
            ok, payload, mark = self._channel.recv()
            if not ok:
                self._remote_remainder = mark
                return
            self._mark = mark
            if mark >= 0:
                self._remote_remainder = mark
            yield payload

    def _cut(self, batch: Any) -> list[Any]:
        """Rank r's slice of a collated global batch, or None when the batch has nothing for it."""
        size = batch_length(batch)
        pieces: list[Any] = []
        spec_for = getattr(self._shard, "spec_for", None)  # batches the dataset made: sized each
        spec = self._shard.spec if spec_for is None else spec_for(size)
        for r in range(self._world):
            bounds = sh.piece_bounds(size, spec, r)
            if bounds is None:
                pieces.append(None)
            elif self._slice_fn is not None:
                pieces.append(
                    self._slice_fn(batch, slice(*bounds), process_index=r, num_processes=self._world)
                )
            else:
                pieces.append(slice_batch(batch, slice(*bounds), size))
        return pieces

    def _produce(self, inner: Iterator[Any], global_mode: bool, counts: list[int] | None) -> Iterator[Any]:
        """Rank 0's pass: send each round's batches, then yield its own. With `counts` (each
        rank's batches in the pass) every batch message says whether it is its rank's last."""
        ended: set[int] = set()
        n = self._world
        rounds = _cut_each(inner, self._cut) if global_mode else _group(inner, n)
        sent = [0] * n
        for number, pieces in enumerate(rounds):
            if number == 0:  # rank 0 frees a few rounds at once: glibc must keep that memory
                heap.keep_freed(4 * heap.tensor_bytes(pieces))
            if len(pieces) == n and not ended and all(p is not None for p in pieces):
                msgs = dict(zip(range(1, n), pieces[1:]))  # the usual round: a batch for everyone
            else:
                pieces = pieces + [None] * (n - len(pieces))
                end = EndMsg(self._final_remainder())  # a final round: the remainder is known now
                msgs = {r: (end if pieces[r] is None else pieces[r]) for r in range(1, n) if r not in ended}
                ended.update(r for r, m in msgs.items() if m is end)
            if msgs:
                self._channel.send_round(msgs, None if counts is None else self._marks(msgs, sent, counts))
            mine = pieces[0]
            del pieces, msgs  # hold no other rank's batch while the next round loads
            if mine is not None:
                yield mine
            del mine
        final = EndMsg(self._final_remainder())
        last = {r: final for r in range(1, n) if r not in ended}
        if last:
            self._channel.send_round(last)
        self._channel.end_pass()

    def _marks(self, msgs: dict[int, Any], sent: list[int], counts: list[int]) -> dict[int, int]:
        """For each batch in `msgs`: `MORE`, or the final remainder when it is its rank's last."""
        marks = {}
        for r, msg in msgs.items():
            if not isinstance(msg, EndMsg):
                sent[r] += 1
                marks[r] = MORE if sent[r] < counts[r] else max(self._final_remainder(), 0)
        return marks


def _group(inner: Iterator[Any], n: int) -> Iterator[list[Any]]:
    """Batches in rounds of `n` (the last may be short), keeping no reference between rounds."""
    round_: list[Any] = []
    for batch in inner:
        round_.append(batch)
        del batch
        if len(round_) == n:
            yield round_
            round_ = []
    if round_:
        yield round_


def _cut_each(inner: Iterator[Any], cut: Callable[[Any], list[Any]]) -> Iterator[list[Any]]:
    """Each global batch cut into the ranks' pieces, keeping no reference between batches."""
    for batch in inner:
        pieces = cut(batch)
        del batch
        yield pieces
        del pieces


if StatefulDataLoader is not None:

    class StatefulDataLoaderDispatcher(DataLoaderDispatcher, StatefulDataLoader):  # type: ignore[misc,valid-type]
        """`DataLoaderDispatcher` backed by torchdata's `StatefulDataLoader`."""

    DataLoaderDispatcher._stateful_twin = StatefulDataLoaderDispatcher

else:  # pragma: no cover
    StatefulDataLoaderDispatcher = None  # type: ignore[assignment,misc]
