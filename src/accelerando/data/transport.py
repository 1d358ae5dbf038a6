"""Moving one rank's batch from rank 0 to rank r for `dispatch_batches=True`.

A batch is its pickled structure (tensors replaced by slots) plus each tensor's bytes, announced
by an 8-int control message. Rank 0 loads every rank's data, so it must not also copy it:

- ranks on rank 0's host that may read its memory (`cross_memory`) get the structure and the
  tensors' addresses through a ring of shared-memory files (`/dev/shm`) and copy the bytes out of
  rank 0 themselves; rank 0 keeps those tensors alive until the receiver says it is done;
- other ranks on its host get the bytes copied into that ring (one copy each side);
- ranks on other hosts get both over a dedicated gloo group.

Local ranks get the control message through a named pipe (they sleep in `read` until it arrives).
Every message carries the number of the pass it belongs to, so a pass that was left early (a
`break` on every rank) leaves nothing behind for the next one.
"""

from __future__ import annotations

import os
import pickle
import select
import socket
import struct
import time
import uuid
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from accelerando.data import cross_memory
from accelerando.ops.tree import recursively_apply

_BATCH, _END, _REMOTE = 0, 1, 2  # bytes in the ring / end of pass / bytes read from rank 0
_ALIGN = 64
_SLOTS = 4  # buffers rank 0 may fill ahead of a receiver
_SHM_DIR = "/dev/shm"
_POLL_INTERVAL, _POLL_SECONDS = 20e-6, 5e-3  # a waiting receiver polls this long before it blocks
_CTRL = struct.Struct("<8q")  # kind, header, total, remainder, seq, slot, generation, pass


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


def _split(batch: Any) -> tuple[Any, list[torch.Tensor], Any]:
    """(structure with tensors replaced by slots, the tensors in slot order, a key that names the
    structure exactly when the batch is a tensor, or a tuple, list or dict of tensors; else None)."""
    tensors: list[torch.Tensor] = []

    def take(t: torch.Tensor) -> _Slot:
        tensors.append(t.detach())
        return _Slot(len(tensors) - 1)

    kind = type(batch)
    if kind is torch.Tensor:
        return take(batch), tensors, (kind,)
    if kind in (tuple, list) and all(type(x) is torch.Tensor for x in batch):
        return kind(take(x) for x in batch), tensors, (kind, len(batch))
    if kind is dict and all(type(x) is torch.Tensor for x in batch.values()):
        return {k: take(v) for k, v in batch.items()}, tensors, (kind, tuple(batch))
    return recursively_apply(take, batch), tensors, None


def _join(skeleton: Any, tensors: list[torch.Tensor]) -> Any:
    return recursively_apply(lambda s: tensors[s.index], skeleton, test_type=lambda x: isinstance(x, _Slot))


def pack(batch: Any) -> Packed:
    """Plan the buffer for `batch`: its pickled skeleton and where each tensor's bytes go."""
    skeleton, tensors, _ = _split(batch)
    metas = [(t.dtype, tuple(t.shape)) for t in tensors]
    header = pickle.dumps((skeleton, metas), protocol=pickle.HIGHEST_PROTOCOL)
    offsets, total = _layout(len(header), metas)
    return Packed(header, tensors, offsets, total)


class RemoteCodec:
    """Describes batches by address for a cross-memory receiver, re-using the description of the
    structure (pickled skeleton, dtypes, shapes) while it repeats, as it does batch after batch.

    A message is that description followed by one (address, bytes) pair per tensor.
    """

    def __init__(self) -> None:
        self._key: Any = None
        self._layout: Any = None
        self._header = b""

    def pack(self, batch: Any) -> tuple[bytes, bytes, list[torch.Tensor]]:
        """(structure, addresses, the tensors to keep alive until the receiver has read them)."""
        skeleton, tensors, key = _split(batch)
        tensors = [t.contiguous() if t.is_cpu else t.cpu().contiguous() for t in tensors]
        metas = [(t.dtype, t.shape) for t in tensors]
        if key is None or (key, metas) != self._key:
            self._key = None if key is None else (key, metas)
            self._header = pickle.dumps((skeleton, metas), protocol=pickle.HIGHEST_PROTOCOL)
        where = [v for t in tensors for v in (t.data_ptr(), t.numel() * t.element_size())]
        return self._header, struct.pack(f"<{len(where)}q", *where), tensors

    def unpack(self, header: bytes, where: bytes, pid: int, pin: bool) -> Any:
        """In the receiving process: copy each tensor out of process `pid`."""
        if header != self._header:
            self._header, self._layout = header, pickle.loads(header)
        skeleton, metas = self._layout
        tensors = [torch.empty(shape, dtype=dtype, pin_memory=pin) for dtype, shape in metas]
        pairs = struct.unpack(f"<{len(where) // 8}q", where)
        cross_memory.read(pid, list(zip(pairs[::2], pairs[1::2])), tensors)
        return _join(skeleton, tensors)


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
    return _join(skeleton, tensors)


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


@dataclass
class _Ring:
    """What a receiver may still read: `held[slot]` stays alive until `ack` (messages the receiver
    has consumed) reaches `seq` (messages sent)."""

    ack: Any  # a one-int numpy view of the shared counter (reads in 0.1 us, a tensor's in 1 us)
    seq: int = 0
    freed: int = 0
    held: list[list[torch.Tensor]] = field(default_factory=lambda: [[] for _ in range(_SLOTS)])

    def unread(self) -> bool:
        return int(self.ack[0]) < self.seq

    def reclaim(self) -> None:
        """Drop what the receiver has read, early: the loader's next batch may reuse that warm memory."""
        read = int(self.ack[0])
        while self.freed < read:
            self.held[self.freed % _SLOTS] = []
            self.freed += 1


_ORPHANS: list[_Ring] = []  # rings of dropped channels whose receiver may still be reading them


def _prune_orphans() -> None:
    _ORPHANS[:] = [ring for ring in _ORPHANS if ring.unread()]


def _close(fd: int, paths: set[str], ring: _Ring) -> None:
    os.close(fd)
    _unlink_all(paths)
    if ring.unread() and any(ring.held):
        _ORPHANS.append(ring)  # a receiver may still copy these out of our memory


class _ShmWriter:
    """Rank 0's ring of shared-memory buffers towards one receiver, plus a named pipe for control.

    The receiver writes how many messages it has consumed into a shared counter; a slot is reused
    only after its previous message was read (rank 0 runs at most `_SLOTS` messages ahead), and
    only then are the tensors a cross-memory message pointed at released, even if the channel is
    dropped meanwhile.
    """

    def __init__(self, base: str) -> None:
        _prune_orphans()
        self.base = base
        self.paths: set[str] = set()
        ack = _create(f"{base}-ack", 8).view(torch.int64).numpy()
        self.paths.add(f"{base}-ack")
        ack[0] = 0
        self.ring = _Ring(ack)
        os.mkfifo(f"{base}-ctl")  # the receiver sleeps in read() until a control message arrives
        self.paths.add(f"{base}-ctl")
        self.fd = os.open(f"{base}-ctl", os.O_RDWR)
        self.views: list[torch.Tensor | None] = [None] * _SLOTS
        self.arrays: list[Any] = [None] * _SLOTS  # the same buffers as numpy arrays (cheap writes)
        self.gens = [0] * _SLOTS
        self.fresh: dict[str, int] = {}  # slot file -> first message using it; unlinked once read
        self._finalizer = weakref.finalize(self, _close, self.fd, self.paths, self.ring)

    def forget(self, path: str) -> None:
        """Unlink a file the receiver has opened: the mappings live on, and a killed job leaves
        nothing in /dev/shm."""
        if path in self.paths:
            os.unlink(path)
            self.paths.discard(path)

    def control(self, values: list[int]) -> None:
        os.write(self.fd, _CTRL.pack(*values))  # 64 bytes < PIPE_BUF: one atomic write

    def wait_read(self) -> None:
        """Block until the receiver has consumed every message sent so far."""
        while self.ring.unread():
            time.sleep(_POLL_INTERVAL)

    def slot(self, size: int) -> tuple[int, int, int, torch.Tensor]:
        """(seq, slot, generation, buffer) for the next message, once the receiver freed that slot."""
        ring = self.ring
        seq, slot = ring.seq, ring.seq % _SLOTS
        while int(ring.ack[0]) < seq - _SLOTS + 1:
            time.sleep(_POLL_INTERVAL)
        ring.reclaim()
        for path, first in list(self.fresh.items()) if self.fresh else ():
            if first < int(ring.ack[0]):  # the receiver read a message in it, so it has it mapped
                self.forget(path)
                del self.fresh[path]
        view = self.views[slot]
        if view is None or self.arrays[slot].size < size:
            self.forget(f"{self.base}-{slot}-{self.gens[slot]}")
            self.gens[slot] += 1
            path = f"{self.base}-{slot}-{self.gens[slot]}"
            view = _create(path, max(size + size // 4, 1 << 16))
            self.paths.add(path)
            self.fresh[path] = seq
            self.views[slot] = view
            self.arrays[slot] = view.numpy()
        ring.seq += 1
        return seq, slot, self.gens[slot], view


class _ShmReader:
    def __init__(self, base: str) -> None:
        """Open rank 0's pipe and counter (they exist: the channel's creators met at a barrier)."""
        self.base = base
        self.ack = _map(f"{base}-ack", 8).view(torch.int64).numpy()
        self.fd = os.open(f"{base}-ctl", os.O_RDONLY | os.O_NONBLOCK)
        weakref.finalize(self, os.close, self.fd)
        self.maps: dict[int, tuple[int, torch.Tensor]] = {}

    def control(self) -> tuple[int, ...]:
        """The next control message. Poll, then block: a reader blocked in `read` is woken by rank
        0's `write`, and the scheduler then often runs it on rank 0's core, stalling the loader."""
        deadline = time.monotonic() + _POLL_SECONDS
        while True:
            try:
                data = os.read(self.fd, _CTRL.size)  # whole messages: each write is one atomic message
            except BlockingIOError:
                if time.monotonic() < deadline:
                    time.sleep(_POLL_INTERVAL)
                else:
                    select.select([self.fd], [], [])
                continue
            if not data:
                raise RuntimeError("dispatch_batches: rank 0 closed the data channel")
            return _CTRL.unpack(data)

    def release(self, seq: int) -> None:
        """Give the slot of message `seq` (and what it pointed at) back to rank 0."""
        self.ack[0] = seq + 1

    def view(self, slot: int, gen: int, total: int) -> torch.Tensor:
        cached = self.maps.get(slot)
        if cached is None or cached[0] != gen:
            path = f"{self.base}-{slot}-{gen}"
            cached = (gen, _map(path, os.path.getsize(path)))
            self.maps[slot] = cached
        return cached[1][:total]


@dataclass(frozen=True)
class Plan:
    """Who reaches rank 0 how: `token` names the shared-memory files, `local` ranks share its host,
    `cross` (a subset) may read its memory, whose process id is `pid`."""

    token: str | None = None
    local: frozenset[int] = frozenset()
    cross: frozenset[int] = frozenset()
    pid: int = -1


def shared_memory_plan(group: Any) -> Plan:
    """Find the ranks on rank 0's host and those that can read rank 0's memory; collective over `group`."""
    rank = dist.get_rank(group)
    where = (socket.gethostname(), os.path.isdir(_SHM_DIR) and os.access(_SHM_DIR, os.W_OK))
    everyone: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, where, group=group)
    host, ok = everyone[0]
    local = frozenset(r for r, (h, can) in enumerate(everyone) if r and ok and can and h == host)
    probe = torch.tensor(list(os.urandom(16)), dtype=torch.uint8)
    if rank == 0:
        cross_memory.allow_readers()
    offer: list[Any] = [uuid.uuid4().hex[:16], os.getpid(), probe.data_ptr(), probe.numpy().tobytes()]
    dist.broadcast_object_list(offer, src=0, group=group)
    token, pid, address, expected = offer
    can_read = rank in local and cross_memory.probe(pid, address, expected)
    dist.all_gather_object(everyone, can_read, group=group)
    cross = frozenset(r for r, yes in enumerate(everyone) if yes)
    return Plan(token, local, cross, pid)


class Channel:
    """Rank 0 -> rank r messages: an 8-int control message, then the batch (see the module doc).

    Both ends call `begin_pass` when a pass starts; rank 0 calls `end_pass` when it finishes one.
    """

    def __init__(self, group: Any, rank: int, plan: Plan, pin: bool) -> None:
        self.group, self.rank, self.pin, self.pid = group, rank, pin, plan.pid
        self.cross = plan.cross
        base = f"{_SHM_DIR}/accelerando-{plan.token}"
        token = plan.token
        self.base = base if token else ""
        self.writers = {r: _ShmWriter(f"{base}-{r}") for r in plan.local} if rank == 0 and token else {}
        self.reader: _ShmReader | None = None
        self.local = plan.local
        self.pending: deque[list[Any]] = deque()
        self.pass_id = 0
        self.codec = RemoteCodec()

    def connect(self) -> None:
        """Receivers open rank 0's files; call after every rank created its channel (a barrier)."""
        if self.rank in self.local and self.base:
            self.reader = _ShmReader(f"{self.base}-{self.rank}")

    def connected(self) -> None:
        """Rank 0, once every receiver has connected (a barrier): unlink the pipes and counters."""
        for writer in self.writers.values():
            writer.forget(f"{writer.base}-ack")
            writer.forget(f"{writer.base}-ctl")

    def begin_pass(self) -> None:
        self.pass_id += 1

    def reclaim(self) -> None:
        """Rank 0, between batches: release the batches receivers have finished reading."""
        for writer in self.writers.values():
            writer.ring.reclaim()

    def end_pass(self) -> None:
        """Wait until every receiver has taken the pass's messages (a process may exit right after,
        and a cross-memory receiver reads rank 0's own memory).

        A pass left early skips this: the receivers drop what it had sent ahead as stale.
        """
        self.flush()
        for writer in self.writers.values():
            writer.wait_read()

    def send_round(self, messages: dict[int, Any]) -> None:
        """Send one message per destination rank: a batch, or an `EndMsg`."""
        keep: list[Any] = []
        for dst, payload in messages.items():
            writer = self.writers.get(dst)
            if isinstance(payload, EndMsg):
                end = [_END, 0, 0, payload.remainder, -1, 0, 0, self.pass_id]
                if writer is not None:
                    writer.control(end)
                else:
                    ctrl = torch.tensor(end, dtype=torch.int64)
                    keep += [dist.isend(ctrl, dst, group=self.group), ctrl]
                continue
            if writer is not None and dst in self.cross:
                header, where, tensors = self.codec.pack(payload)
                total = len(header) + len(where)
                seq, slot, gen, view = writer.slot(total)
                writer.arrays[slot][:total] = memoryview(header + where)
                writer.ring.held[slot] = tensors
                writer.control([_REMOTE, len(header), total, -1, seq, slot, gen, self.pass_id])
                continue
            packed = pack(payload)
            if writer is not None:
                seq, slot, gen, view = writer.slot(packed.total)
                packed.write(view)
                writer.control([_BATCH, len(packed.header), packed.total, -1, seq, slot, gen, self.pass_id])
                continue
            buf = torch.empty(packed.total, dtype=torch.uint8)
            packed.write(buf)
            info = [_BATCH, len(packed.header), packed.total, -1, -1, 0, 0, self.pass_id]
            ctrl = torch.tensor(info, dtype=torch.int64)
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
        """(True, batch) or (False, remainder) when this rank's pass is over.

        Messages left from an earlier, abandoned pass are read and dropped.
        """
        while True:
            if self.reader is not None:
                kind, hlen, total, rem, seq, slot, gen, pass_id = self.reader.control()
            else:
                ctrl = torch.empty(_CTRL.size // 8, dtype=torch.int64)
                dist.recv(ctrl, 0, group=self.group)
                kind, hlen, total, rem, seq, slot, gen, pass_id = (int(x) for x in ctrl.tolist())
            stale = pass_id < self.pass_id
            if kind == _END:
                if stale:
                    continue
                return False, rem
            if self.reader is None:
                buf = torch.empty(total, dtype=torch.uint8, pin_memory=self.pin and not stale)
                dist.recv(buf, 0, group=self.group)
                if stale:
                    continue
                return True, decode(buf, hlen)
            if stale:
                self.reader.view(slot, gen, 0)  # map a new slot file now: rank 0 unlinks it once read
                self.reader.release(seq)
                continue
            view = self.reader.view(slot, gen, total)
            if kind == _REMOTE:
                raw = view.numpy()
                batch = self.codec.unpack(raw[:hlen].tobytes(), raw[hlen:total].tobytes(), self.pid, self.pin)
            else:
                batch = decode(view.clone(), hlen)
            self.reader.release(seq)
            return True, batch


def _wait(items: list[Any]) -> None:
    for item in items:
        if not isinstance(item, torch.Tensor):
            item.wait()
