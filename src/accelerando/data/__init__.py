"""Distributed data loading: pure sharding math (`sharding`), samplers, prepared loaders, dispatch, skip."""

from accelerando.data.dispatch import DataLoaderDispatcher
from accelerando.data.loaders import DataLoaderShard, DataLoaderStateMixin, PreparedLoaderMixin
from accelerando.data.prepare import prepare_data_loader
from accelerando.data.samplers import BatchSamplerShard, IterableDatasetShard, SeedableRandomSampler
from accelerando.data.sharding import ShardSpec
from accelerando.data.skip import SkipBatchSampler, SkipDataLoader, skip_first_batches

__all__ = [
    "BatchSamplerShard",
    "DataLoaderDispatcher",
    "DataLoaderShard",
    "DataLoaderStateMixin",
    "IterableDatasetShard",
    "PreparedLoaderMixin",
    "SeedableRandomSampler",
    "ShardSpec",
    "SkipBatchSampler",
    "SkipDataLoader",
    "prepare_data_loader",
    "skip_first_batches",
]
