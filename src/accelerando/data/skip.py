"""`skip_first_batches`: resume mid-epoch without loading the batches already seen.

For map-style data the skip is index arithmetic on the batch sampler: no skipped sample is ever
loaded, so the cost does not grow with the cost of a sample. An iterable dataset cannot jump, so
its skipped samples are read (but never collated or sent). The skip applies to the next pass
only: later passes are whole epochs, so the returned loader can stay in use.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data import BatchSampler, DataLoader, IterableDataset, Sampler

from accelerando.data import sharding as sh
from accelerando.data.loaders import PreparedLoaderMixin
from accelerando.data.prepare import loader_kwargs
from accelerando.data.samplers import is_plain_batch_sampler


class SkipBatchSampler(Sampler[list[int]]):
    """A batch sampler that starts its next pass at batch `skip_batches` (Accelerate's name)."""

    def __init__(self, batch_sampler: Any, skip_batches: int = 0) -> None:
        self.batch_sampler = batch_sampler
        self.skip_batches = skip_batches
        self.batch_size = getattr(batch_sampler, "batch_size", None)
        self.drop_last = getattr(batch_sampler, "drop_last", False)
        self.sampler = getattr(batch_sampler, "sampler", None)

    def __len__(self) -> int:
        return max(len(self.batch_sampler) - self.skip_batches, 0)

    @property
    def total_length(self) -> int:
        return len(self.batch_sampler)

    def __iter__(self) -> Iterator[list[int]]:
        skip, self.skip_batches = self.skip_batches, 0
        if is_plain_batch_sampler(self.batch_sampler):
            indices = list(self.batch_sampler.sampler)
            size, drop = self.batch_sampler.batch_size, self.batch_sampler.drop_last
            spec = sh.ShardSpec(0, 1, size, drop_last=drop)
            return sh.iter_rank_batches(indices, spec, skip)
        return _drop_first(iter(self.batch_sampler), skip)


def _drop_first(it: Iterator[Any], count: int) -> Iterator[Any]:
    for i, item in enumerate(it):
        if i >= count:
            yield item


class SkipDataLoader(DataLoader):
    """A DataLoader over an iterable dataset whose next pass drops its first `skip_batches` batches."""

    def __init__(self, dataset: Any, skip_batches: int = 0, **kwargs: Any) -> None:
        super().__init__(dataset, **kwargs)
        self.skip_batches = skip_batches

    def __len__(self) -> int:
        return max(super().__len__() - self.skip_batches, 0)

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        skip, self.skip_batches = self.skip_batches, 0
        yield from _drop_first(iter(super().__iter__()), skip)


def _plain_kwargs(dl: DataLoader) -> dict[str, Any]:
    kw = loader_kwargs(dl)
    kw.pop("snapshot_every_n_steps", None)
    kw["generator"] = dl.generator
    return kw


def skip_first_batches(dataloader: Any, num_batches: int = 0) -> Any:
    """A loader over the same data whose next pass starts at batch `num_batches` of the current epoch.

    `num_batches` counts from the start of the epoch (it replaces, not adds to, a position restored
    by `load_state_dict`). `len()` of the result is the number of batches left in that pass.
    """
    if not isinstance(num_batches, int) or isinstance(num_batches, bool) or num_batches < 0:
        raise ValueError(f"skip_first_batches: num_batches={num_batches!r} must be an integer >= 0")
    if isinstance(dataloader, PreparedLoaderMixin):
        return dataloader._clone_from(num_batches)
    if not isinstance(dataloader, DataLoader):
        raise TypeError(f"skip_first_batches expects a DataLoader, got {type(dataloader).__name__}")
    kw = _plain_kwargs(dataloader)
    if isinstance(dataloader.dataset, IterableDataset):
        kw.update(batch_size=dataloader.batch_size, drop_last=dataloader.drop_last)
        return SkipDataLoader(dataloader.dataset, skip_batches=num_batches, **kw)
    if dataloader.batch_sampler is not None:
        return DataLoader(
            dataloader.dataset, batch_sampler=SkipBatchSampler(dataloader.batch_sampler, num_batches), **kw
        )
    if isinstance(dataloader.sampler, BatchSampler):
        kw.update(batch_size=None)
        return DataLoader(dataloader.dataset, sampler=SkipBatchSampler(dataloader.sampler, num_batches), **kw)
    kw.update(batch_size=None)  # no automatic batching: one sample per "batch"
    return DataLoader(dataloader.dataset, sampler=list(dataloader.sampler)[num_batches:], **kw)
