"""Bringing an offloaded block's weights to its device while the block before it runs.

One background thread per process issues the copies, so the main thread keeps launching the
current block's kernels. On a backend with streams the copies go on a side stream of the execution
device, through pinned chunk buffers (`transfer.StagedCopier`), and the compute stream waits for
them only when the block starts: an event, never a host synchronisation. Tensors made on the side
stream are recorded on the compute stream, so the allocator does not hand their memory to the next
prefetch while a kernel still reads them. Without streams (MPS, XLA) the thread does a plain `.to()`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from accelerando.big_model.transfer import StagedCopier
from accelerando.devices import Device, get_device

_EXECUTOR: ThreadPoolExecutor | None = None
_FETCHERS: dict[torch.device, StreamFetcher] = {}
STAGING_BUFFERS = 3  # chunks in flight per device: reading one while two travel


def _executor() -> ThreadPoolExecutor:
    global _EXECUTOR
    if _EXECUTOR is None:
        _EXECUTOR = ThreadPoolExecutor(max_workers=1, thread_name_prefix="accelerando-prefetch")
    return _EXECUTOR


def served_dtype(value: torch.Tensor, dtype: torch.dtype) -> torch.dtype | None:
    """The cast a served weight needs: floats follow the model's (meta) dtype; None when none."""
    if value.is_floating_point() and dtype.is_floating_point and value.dtype != dtype:
        return dtype
    return None


class PendingWeights:
    """A block's weights on their way to the device; `wait` hands them over to the compute stream."""

    def __init__(
        self, fetcher: StreamFetcher, future: Future[tuple[list[torch.Tensor], Any]], key: tuple
    ) -> None:
        self.fetcher = fetcher
        self.future = future
        self.key = key

    def wait(self) -> list[torch.Tensor]:
        values, done = self.future.result()
        backend, device = self.fetcher.backend, self.fetcher.device
        compute = backend.current_stream(device)
        if done is not None and compute is not None:
            compute.wait_event(done)
            for value in values:
                backend.record_stream(value, compute)
        return values


class StreamFetcher:
    """Copies weights to one device on a side stream of its own, from the prefetch thread."""

    def __init__(self, backend: Device, device: torch.device) -> None:
        self.backend = backend
        self.device = device
        self.stream = backend.new_stream(device)
        self.copier = StagedCopier(backend, buffers=STAGING_BUFFERS)  # only the prefetch thread uses it

    def start(
        self, weights: Mapping[str, torch.Tensor], names: Sequence[str], dtypes: Sequence[torch.dtype]
    ) -> PendingWeights:
        """Queue the copies of `weights[name]` (cast to float `dtype`) and return at once."""
        future = _executor().submit(self._fetch, weights, list(names), list(dtypes))
        return PendingWeights(self, future, (tuple(names), tuple(dtypes)))

    def _fetch(
        self, weights: Mapping[str, torch.Tensor], names: list[str], dtypes: list[torch.dtype]
    ) -> tuple[list[torch.Tensor], Any]:
        with self.backend.use_stream(self.stream):
            values = [self._one(weights[name], dtype) for name, dtype in zip(names, dtypes)]
            done = None if self.stream is None else self.stream.record_event()
        return values, done

    def _one(self, value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        cast = served_dtype(value, dtype)
        if value.device == self.device and cast is None:
            return value
        if self.stream is None or value.device.type != "cpu" or not value.is_contiguous():
            return value.to(self.device, dtype=cast, non_blocking=True)
        source = value if cast is None else value.to(cast)  # cast on the host, as .to(device, dtype) does
        dest = torch.empty(value.shape, dtype=source.dtype, device=self.device)
        if dest.numel():
            self.copier.copy_into(dest, source, self.stream)
        return dest


def fetcher_for(device: torch.device) -> StreamFetcher | None:
    """The fetcher of an accelerator; None on the cpu, where offloaded weights are used in place."""
    if device.type in ("cpu", "meta"):
        return None
    fetcher = _FETCHERS.get(device)
    if fetcher is None:
        fetcher = _FETCHERS[device] = StreamFetcher(get_device(device.type), device)
    return fetcher
