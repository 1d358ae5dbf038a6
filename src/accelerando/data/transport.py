"""Moving one rank's batch from rank 0 to rank r for `dispatch_batches=True`.

A batch travels as one contiguous byte buffer: the pickled structure (tensors replaced by slots)
followed by each tensor's bytes, announced by a 7-int control message. Ranks on rank 0's host
read the buffer from a ring of shared-memory files (`/dev/shm`) and get the control message
through a named pipe (they sleep in `read` until it arrives): two memory copies, no TCP stack.
Ranks on other hosts get both over a dedicated gloo group.
"""

from __future__ import annotations

import os
import pickle
import socket
import struct
import time
import uuid
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from accelerando.ops.tree import recursively_apply

_BATCH, _END = 0, 1
_ALIGN = 64
_SLOTS = 4  # buffers rank 0 may fill ahead of a receiver
_SHM_DIR = "/dev/shm"
_CTRL = struct.Struct("<7q")


@dataclass(frozen=True)
class _Slot:
    index: int


@dataclass(frozen=True)
class EndMsg:
    """Tells a rank its pass is over, with the final batch's real-sample count for gather_for_metrics."""

    remainder: int


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _nbytes(dtype: torch.dtype, shape: tuple[int, ...]) -> int:
    numel = 1
    for d in shape:
        numel *= d
    return numel * torch.empty((), dtype=dtype).element_size()


def _layout(header_len: int, metas: list[tuple[torch.dtype, tuple[int, ...]]]) -> tuple[list[int], int]:
    offsets, pos = [], _aligned(header_len)
    for dtype, shape in metas:
        offsets.append(pos)
        pos = _aligned(pos + _nbytes(dtype, shape))
    return offsets, pos


@dataclass
class Packed:
    header: bytes
    tensors: list[torch.Tensor]
    offsets: list[int]
    total: int

    def write(self, buf: torch.Tensor) -> None:
        buf[: len(self.header)].copy_(torch.frombuffer(bytearray(self.header), dtype=torch.uint8))
        for t, off in zip(self.tensors, self.offsets):
            if t.numel():
                nbytes = t.numel() * t.element_size()
                buf[off : off + nbytes].view(t.dtype).view(t.shape).copy_(t)


def pack(batch: Any) -> Packed:
    """Plan the buffer for `batch`: its pickled skeleton and where each tensor's bytes go."""
    tensors: list[torch.Tensor] = []

    def take(t: torch.Tensor) -> _Slot:
        tensors.append(t.detach())
        return _Slot(len(tensors) - 1)

    skeleton = recursively_apply(take, batch)
    metas = [(t.dtype, tuple(t.shape)) for t in tensors]
    header = pickle.dumps((skeleton, metas), protocol=pickle.HIGHEST_PROTOCOL)
    offsets, total = _layout(len(header), metas)
    return Packed(header, tensors, offsets, total)


def encode(batch: Any) -> tuple[torch.Tensor, int]:
    packed = pack(batch)
    buf = torch.empty(packed.total, dtype=torch.uint8)
    packed.write(buf)
    return buf, len(packed.header)


def decode(buf: torch.Tensor, header_len: int) -> Any:
    """Inverse of `encode`; the tensors are views into `buf` (no copy)."""
    skeleton, metas = pickle.loads(buf[:header_len].numpy().tobytes())
    offsets, _ = _layout(header_len, metas)
    tensors = []
    for (dtype, shape), off in zip(metas, offsets):
        nbytes = _nbytes(dtype, shape)
        tensors.append(
            buf[off : off + nbytes].view(dtype).view(shape) if nbytes else torch.empty(shape, dtype=dtype)
        )
    return recursively_apply(lambda s: tensors[s.index], skeleton, test_type=lambda x: isinstance(x, _Slot))


def _map(path: str, size: int) -> torch.Tensor:
    return torch.from_file(path, shared=True, size=size, dtype=torch.uint8)


def _create(path: str, size: int) -> torch.Tensor:
    with open(path, "wb") as f:
        f.truncate(size)
    return _map(path, size)


def _unlink_all(paths: set[str]) -> None:
    for path in list(paths):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    paths.clear()


def _close(fd: int, paths: set[str]) -> None:
    os.close(fd)
    _unlink_all(paths)


class _ShmWriter:
    """Rank 0's ring of shared-memory buffers towards one receiver, plus a named pipe for control.

    The receiver writes how many messages it has consumed into a shared counter; a slot is reused
    only after its previous message was read (rank 0 runs at most `_SLOTS` messages ahead).
    """

    def __init__(self, base: str) -> None:
        self.base = base
        self.paths: set[str] = set()
        self.ack = _create(f"{base}-ack", 8).view(torch.int64)
        self.paths.add(f"{base}-ack")
        self.ack.zero_()
        os.mkfifo(f"{base}-ctl")  # the receiver sleeps in read() until a control message arrives
        self.paths.add(f"{base}-ctl")
        self.fd = os.open(f"{base}-ctl", os.O_RDWR)
        self.views: list[torch.Tensor | None] = [None] * _SLOTS
        self.gens = [0] * _SLOTS
        self.seq = 0
        self._finalizer = weakref.finalize(self, _close, self.fd, self.paths)

    def control(self, values: list[int]) -> None:
        os.write(self.fd, _CTRL.pack(*values))  # 56 bytes < PIPE_BUF: one atomic write

    def slot(self, size: int) -> tuple[int, int, int, torch.Tensor]:
        """(seq, slot, generation, buffer) for the next message, once the receiver freed that slot."""
        seq, slot = self.seq, self.seq % _SLOTS
        while int(self.ack[0]) < seq - _SLOTS + 1:
            time.sleep(20e-6)
        view = self.views[slot]
        if view is None or view.numel() < size:
            old = f"{self.base}-{slot}-{self.gens[slot]}"
            self.gens[slot] += 1
            path = f"{self.base}-{slot}-{self.gens[slot]}"
            view = _create(path, max(size + size // 4, 1 << 16))
            self.paths.add(path)
            if old in self.paths:
                os.unlink(old)
                self.paths.discard(old)
            self.views[slot] = view
        self.seq += 1
        return seq, slot, self.gens[slot], view


class _ShmReader:
    def __init__(self, base: str) -> None:
        self.base = base
        self.ack: torch.Tensor | None = None
        self.fd = -1
        self.maps: dict[int, tuple[int, torch.Tensor]] = {}

    def control(self) -> tuple[int, ...]:
        if self.fd < 0:
            self.fd = os.open(f"{self.base}-ctl", os.O_RDONLY)
            weakref.finalize(self, os.close, self.fd)
        data = b""
        while len(data) < _CTRL.size:
            chunk = os.read(self.fd, _CTRL.size - len(data))
            if not chunk:
                raise RuntimeError("dispatch_batches: rank 0 closed the data channel")
            data += chunk
        return _CTRL.unpack(data)

    def read(self, seq: int, slot: int, gen: int, total: int) -> torch.Tensor:
        if self.ack is None:
            self.ack = _map(f"{self.base}-ack", 8).view(torch.int64)
        cached = self.maps.get(slot)
        if cached is None or cached[0] != gen:
            path = f"{self.base}-{slot}-{gen}"
            cached = (gen, _map(path, os.path.getsize(path)))
            self.maps[slot] = cached
        buf = cached[1][:total].clone()
        self.ack[0] = seq + 1
        return buf


def shared_memory_plan(group: Any) -> tuple[str | None, set[int]]:
    """(token, ranks that can read rank 0's /dev/shm); collective over `group`."""
    where = (socket.gethostname(), os.path.isdir(_SHM_DIR) and os.access(_SHM_DIR, os.W_OK))
    everyone: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, where, group=group)
    token = [uuid.uuid4().hex[:16]]
    dist.broadcast_object_list(token, src=0, group=group)
    host, ok = everyone[0]
    local = {r for r, (h, can) in enumerate(everyone) if r and ok and can and h == host}
    return token[0], local


class Channel:
    """Rank 0 -> rank r messages: a 7-int control message, then the bytes (shared memory or gloo)."""

    def __init__(self, group: Any, rank: int, token: str | None, local: set[int], pin: bool) -> None:
        self.group, self.rank, self.pin = group, rank, pin
        base = f"{_SHM_DIR}/accelerando-{token}"
        self.writers = {r: _ShmWriter(f"{base}-{r}") for r in local} if rank == 0 and token else {}
        self.reader = _ShmReader(f"{base}-{rank}") if rank in local and token else None
        self.pending: deque[list[Any]] = deque()

    def send_round(self, messages: dict[int, Any]) -> None:
        keep: list[Any] = []
        for dst, payload in messages.items():
            writer = self.writers.get(dst)
            if isinstance(payload, EndMsg):
                end = [_END, 0, 0, payload.remainder, -1, 0, 0]
                if writer is not None:
                    writer.control(end)
                else:
                    ctrl = torch.tensor(end, dtype=torch.int64)
                    keep += [dist.isend(ctrl, dst, group=self.group), ctrl]
                continue
            packed = pack(payload)
            if writer is not None:
                seq, slot, gen, view = writer.slot(packed.total)
                packed.write(view)
                writer.control([_BATCH, len(packed.header), packed.total, -1, seq, slot, gen])
                continue
            buf = torch.empty(packed.total, dtype=torch.uint8)
            packed.write(buf)
            ctrl = torch.tensor([_BATCH, len(packed.header), packed.total, -1, -1, 0, 0], dtype=torch.int64)
            keep += [
                dist.isend(ctrl, dst, group=self.group),
                ctrl,
                dist.isend(buf, dst, group=self.group),
                buf,
            ]
        if keep:
            self.pending.append(keep)
        while len(self.pending) > _SLOTS:
            _wait(self.pending.popleft())

    def flush(self) -> None:
        while self.pending:
            _wait(self.pending.popleft())

    def recv(self) -> tuple[bool, Any]:
        """(True, batch) or (False, remainder) when this rank's pass is over."""
        if self.reader is not None:
            kind, hlen, total, rem, seq, slot, gen = self.reader.control()
        else:
            ctrl = torch.empty(7, dtype=torch.int64)
            dist.recv(ctrl, 0, group=self.group)
            kind, hlen, total, rem, seq, slot, gen = (int(x) for x in ctrl.tolist())
        if kind == _END:
            return False, rem
        if self.reader is not None:
            buf = self.reader.read(seq, slot, gen, total)
        else:
            buf = torch.empty(total, dtype=torch.uint8, pin_memory=self.pin)
            dist.recv(buf, 0, group=self.group)
        return True, decode(buf, hlen)


def _wait(items: list[Any]) -> None:
    for item in items:
        if not isinstance(item, torch.Tensor):
            item.wait()
