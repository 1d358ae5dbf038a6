"""Host bytes -> device tensors, fast: read into pinned chunks, copy them asynchronously.

A weight bound for an accelerator is read from its file with `preadv` (no page faults, no
page-table work, unlike reading through a memory map) into a page-locked chunk buffer, and the
chunk is copied to the device without waiting (DMA); while it travels the next chunk is read into
a second buffer. Several loader threads do this at once, each with its own buffers, so file reads,
host copies and transfers of different weights overlap. On a backend without streams (the CPU,
MPS) the same code copies synchronously and gives the same tensors.

`StagedCopier` is the per-thread engine (also used by the offload prefetcher, on a side stream);
`DeviceTransfers` is the loader's pool: submit (source, destination) pairs, collect them in order.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from accelerando.devices import Device, get_device

CHUNK_BYTES = 8 << 20  # a DMA this size runs at full speed; 2 per loader thread keep pinned memory small
LOAD_WORKERS = max(1, min(4, os.cpu_count() or 1))  # more threads than this only contend for memory bandwidth


@dataclass(frozen=True)
class FileSpan:
    """`nbytes` raw little-endian bytes of one tensor at `offset` in `path` (a safetensors entry)."""

    path: str
    offset: int
    nbytes: int


HostSource = FileSpan | torch.Tensor

_RAW_FILE_READS = sys.byteorder == "little"  # safetensors stores little-endian


def raw_reads_supported() -> bool:
    """Whether file bytes can be copied as they are (they match the machine's byte order)."""
    return _RAW_FILE_READS


def flat_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's storage bytes as a 1-D uint8 view (no copy)."""
    return tensor.reshape(-1).view(torch.uint8) if tensor.dim() else tensor.reshape(1).view(torch.uint8)


class StagedCopier:
    """Copies host sources into device tensors through a few pinned chunk buffers (one thread's).

    Buffer `i` is refilled only after the transfer that last read it has finished (its event), so
    the host never overwrites bytes in flight. Not thread-safe: each thread owns one.
    """

    def __init__(self, backend: Device, chunk_bytes: int | None = None, buffers: int = 2) -> None:
        self.backend = backend
        self.chunk_bytes = chunk_bytes or CHUNK_BYTES
        self.count = buffers
        self._slab: torch.Tensor | None = None
        self._events: list[Any] = [None] * buffers
        self._next = 0
        self._fds: dict[str, int] = {}

    def _buffer(self, index: int) -> torch.Tensor:
        if self._slab is None:
            self._slab = self.backend.pinned_empty(self.chunk_bytes * self.count)
        return self._slab[index * self.chunk_bytes : (index + 1) * self.chunk_bytes]

    def copy_into(self, dest: torch.Tensor, source: HostSource, stream: Any | None) -> None:
        """Fill contiguous `dest` (same byte size) from `source`; queued on `stream`, not awaited."""
        out = flat_bytes(dest)
        src = source if isinstance(source, FileSpan) else flat_bytes(source)
        total = out.numel()
        expected = src.nbytes if isinstance(src, FileSpan) else src.numel()
        if expected != total:
            raise ValueError(f"source holds {expected} bytes but the destination needs {total}")
        for start in range(0, total, self.chunk_bytes):
            size = min(self.chunk_bytes, total - start)
            slot = self._next
            self._next = (slot + 1) % self.count
            if self._events[slot] is not None:
                self._events[slot].synchronize()
            staging = self._buffer(slot)[:size]
            self._fill(staging, src, start, size)
            out[start : start + size].copy_(staging, non_blocking=stream is not None)
            self._events[slot] = None if stream is None else stream.record_event()

    def _fill(self, staging: torch.Tensor, src: FileSpan | torch.Tensor, start: int, size: int) -> None:
        if isinstance(src, torch.Tensor):
            staging.copy_(src[start : start + size])
            return
        view = memoryview(staging.numpy().data)
        fd = self._fd(src.path)
        done = 0
        while done < size:
            got = _pread_into(fd, view[done:size], src.offset + start + done)
            if got <= 0:
                raise OSError(
                    f"{src.path}: file ends before byte {src.offset + src.nbytes} (truncated checkpoint?)"
                )
            done += got

    def _fd(self, path: str) -> int:
        fd = self._fds.get(path)
        if fd is None:
            fd = self._fds[path] = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        return fd

    def close(self) -> None:
        """Wait for transfers still reading the buffers, close files, release the buffers."""
        for event in self._events:
            if event is not None:
                event.synchronize()
        self._events = [None] * self.count
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self._slab = None


def _pread_into(fd: int, view: memoryview, offset: int) -> int:
    if hasattr(os, "preadv"):
        return os.preadv(fd, [view], offset)
    data = os.pread(fd, len(view), offset) if hasattr(os, "pread") else _seek_read(fd, len(view), offset)
    view[: len(data)] = data
    return len(data)


def _seek_read(fd: int, size: int, offset: int) -> bytes:
    os.lseek(fd, offset, os.SEEK_SET)
    return os.read(fd, size)


@dataclass(frozen=True)
class Transfer:
    """One weight to put on `device` as `dtype`: from file bytes (already `dtype`) or a cpu tensor."""

    source: HostSource
    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device


def backend_of(device: torch.device) -> Device:
    return get_device(device.type)


def has_streams(device: torch.device) -> bool:
    """Whether copies to `device` can be queued and overlapped (CUDA, XPU, ...; not MPS, XLA or the CPU)."""
    return backend_of(device).current_stream(device) is not None


class DeviceTransfers:
    """A pool of loader threads turning `Transfer`s into device tensors, overlapped.

    `submit` returns at once; `results()` yields the tensors in submission order. Copies run on the
    stream that was current on each device when the pool was made (what the caller would have
    used); `results()` waits for those streams at the end, so its tensors are ready to use.
    """

    def __init__(self, workers: int | None = None, chunk_bytes: int | None = None) -> None:
        self.workers = workers or LOAD_WORKERS
        self.chunk_bytes = chunk_bytes or CHUNK_BYTES
        self._pool: ThreadPoolExecutor | None = None
        self._local = threading.local()
        self._copiers: list[StagedCopier] = []
        self._lock = threading.Lock()
        self._streams: dict[torch.device, Any] = {}
        self._pending: list[Future[torch.Tensor]] = []

    def reserve(self, bytes_per_device: dict[torch.device, int]) -> None:
        """Warm each device's allocator for what is about to arrive (one driver allocation, not hundreds)."""
        for device, nbytes in bytes_per_device.items():
            if nbytes > 0:
                backend_of(device).reserve_memory(nbytes, device)

    def submit(self, transfer: Transfer) -> None:
        if transfer.device not in self._streams:
            self._streams[transfer.device] = backend_of(transfer.device).current_stream(transfer.device)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="accelerando-load")
        self._pending.append(self._pool.submit(self._run, transfer, self._streams[transfer.device]))

    def _copier(self, backend: Device) -> StagedCopier:
        copier = getattr(self._local, "copier", None)
        if copier is None:
            copier = self._local.copier = StagedCopier(backend, self.chunk_bytes)
            with self._lock:
                self._copiers.append(copier)
        return copier

    def _run(self, transfer: Transfer, stream: Any | None) -> torch.Tensor:
        backend = backend_of(transfer.device)
        source = transfer.source
        if isinstance(source, torch.Tensor) and not source.is_contiguous():
            return source.to(transfer.device, dtype=transfer.dtype)  # keeps the source's strides, as .to does
        if isinstance(source, torch.Tensor):
            source = source.to(transfer.dtype)  # cast on the host, where a plain .to(device, dtype) casts too
        with backend.use_stream(stream):
            dest = torch.empty(transfer.shape, dtype=transfer.dtype, device=transfer.device)
            if dest.numel():
                self._copier(backend).copy_into(dest, source, stream)
        return dest

    def results(self) -> Iterator[torch.Tensor]:
        """The tensors in submission order; every copy has landed when the iteration ends."""
        try:
            for future in self._pending:
                yield future.result()
            for stream in self._streams.values():
                if stream is not None:
                    stream.synchronize()
        finally:
            self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        for copier in self._copiers:
            copier.close()
        self._copiers.clear()
        self._pending.clear()
