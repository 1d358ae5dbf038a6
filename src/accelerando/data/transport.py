"""Moving one rank's batch from rank 0 to rank r for `dispatch_batches=True`.

- Ranks on rank 0's host that may read its memory get the tensors' addresses through a
  shared-memory ring (`shm_ring`) and copy the bytes straight out of rank 0 (`cross_memory`);
  rank 0 keeps those tensors until the receiver has read them. By default that is where the system
  already allows it (no Yama, or ptrace_scope=0): rank 0 opens nothing. With
  `ACCELERANDO_DISPATCH_CROSS_MEMORY=1` rank 0 also lets any process of its user read it
  (`PR_SET_PTRACER_ANY`, for Yama ptrace_scope=1); with `=0` no rank reads it.
- The other ranks on its host get the bytes copied into the ring: one copy each side.
- Ranks on other hosts get both over gloo: the default group when it is gloo, else one gloo
  group that every channel of the process shares, each channel with its own message tag.

Every message is announced by a `Record` carrying the number of the pass it belongs to, so a pass
that was left early (a `break` on every rank) leaves nothing behind for the next one. Every wait
ends: the ring's when the peer exits or after the group's timeout, gloo's likewise; either raises
naming the rank.
"""

from __future__ import annotations

import os
import socket
import sys
from collections import deque
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from accelerando.config import env
from accelerando.data import cross_memory, shm_ring
from accelerando.data.batch_codec import Codec, Packed, copy_bytes
from accelerando.data.shm_ring import RECORD_SIZE, SLOTS, Record, RingReader, RingWriter

BATCH, END, REMOTE = 0, 1, 2  # bytes / end of pass / addresses to read from rank 0's memory
_TAG_BASE = 1 << 20  # gloo message tags of channel n are _TAG_BASE + n, clear of a user's own tags
# What a batch message says of the batches after it (>= 0: it is the rank's last; the final remainder)
UNKNOWN, MORE = -1, -2


@dataclass(frozen=True)
class EndMsg:
    """Tells a rank its pass is over, with the final batch's real-sample count for gather_for_metrics."""

    remainder: int


def group_timeout(group: Any) -> float:
    """Seconds a collective of `group` may wait (`init_process_group(timeout=...)`): the ring waits as long."""
    try:
        return float(group._get_backend(torch.device("cpu")).options._timeout.total_seconds())
    except (AttributeError, RuntimeError):
        return timedelta(minutes=30).total_seconds()  # torch's default


class Channel:
    """Rank 0 -> rank r messages: a `Record`, then the batch (see the module doc).

    Both ends call `begin_pass` when a pass starts; rank 0 calls `end_pass` when it finishes one.
    """

    def __init__(self, group: Any, rank: int, pin: bool, tag: int = _TAG_BASE) -> None:
        self.group, self.rank, self.pin, self.tag = group, rank, pin, tag
        self.writers: dict[int, RingWriter] = {}  # rank 0: one per receiver on its host
        self.reader: RingReader | None = None  # a receiver on rank 0's host
        self.cross: frozenset[int] = frozenset()  # receivers that read rank 0's memory themselves
        self.pending: deque[list[Any]] = deque()
        self.pass_id = 0
        self.codec = Codec()

    def begin_pass(self) -> None:
        self.pass_id += 1

    def end_pass(self) -> None:
        """Wait until every receiver has taken the pass's messages (a process may exit right after,
        and a cross-memory receiver reads rank 0's own memory).

        A pass left early skips this: the receivers drop what it had sent ahead as stale.
        """
        self.flush()
        for writer in self.writers.values():
            writer.wait_read()

    def send_round(self, messages: dict[int, Any], marks: dict[int, int] | None = None) -> None:
        """Send one message per destination rank: a batch, or an `EndMsg`. `marks[dst]` says what
        follows a batch: `UNKNOWN`, `MORE` batches, or nothing (the final remainder, >= 0)."""
        self.pending.append([])
        for dst, payload in messages.items():
            if isinstance(payload, EndMsg):
                self._send(dst, Record(END, 0, 0, payload.remainder, -1, self.pass_id))
                continue
            cross = dst in self.cross
            packed = self.codec.pack_addresses(payload) if cross else self.codec.pack(payload)
            mark = UNKNOWN if marks is None else marks.get(dst, UNKNOWN)
            record = Record(
                REMOTE if cross else BATCH, len(packed.header), packed.total, mark, -1, self.pass_id
            )
            self._send(dst, record, packed)
        if not self.pending[-1]:
            self.pending.pop()
        while len(self.pending) > SLOTS:
            _wait(self.pending.popleft())

    def _send(self, dst: int, record: Record, packed: Packed | None = None) -> None:
        writer = self.writers.get(dst)
        if writer is not None:
            if packed is not None:
                slot, buf = writer.reserve(packed.total)
                packed.write(buf)
                record = record._replace(slot=slot)
            writer.post(record, keep=packed.tensors if packed is not None and packed.where else None)
            return
        sends = [torch.frombuffer(bytearray(record.pack()), dtype=torch.uint8)]
        if packed is not None:
            sends.append(torch.empty(packed.total, dtype=torch.uint8))
            packed.write(sends[1])
        self.pending[-1] += [(dst, dist.isend(b, dst, group=self.group, tag=self.tag), b) for b in sends]

    def flush(self) -> None:
        while self.pending:
            _wait(self.pending.popleft())

    def _gloo_recv(self, size: int, pin: bool = False) -> torch.Tensor:
        buf = torch.empty(size, dtype=torch.uint8, pin_memory=pin)
        try:
            dist.recv(buf, 0, group=self.group, tag=self.tag)
        except RuntimeError as err:
            raise RuntimeError(f"dispatch_batches: receiving from rank 0 failed: {err}") from err
        return buf

    def recv(self) -> tuple[bool, Any, int]:
        """(True, batch, its mark) or (False, None, remainder) when this rank's pass is over.

        Messages left from an earlier, abandoned pass are read and dropped.
        """
        while True:
            if self.reader is not None:
                record = self.reader.recv()
            else:
                record = Record.unpack(self._gloo_recv(RECORD_SIZE).numpy().tobytes())
            current = record.pass_id >= self.pass_id
            if record.kind == END:
                if current:
                    return False, None, record.mark
            elif current:
                return True, self._payload(record), record.mark
            elif self.reader is not None:
                self.reader.release()
            else:
                self._gloo_recv(record.total)

    def _payload(self, record: Record) -> Any:
        if self.reader is None:
            return self.codec.decode(self._gloo_recv(record.total, self.pin), record.header)
        view = self.reader.view(record.slot, record.total)
        if record.kind == REMOTE:
            raw = view.numpy()
            head, where = raw[: record.header].tobytes(), raw[record.header :].tobytes()
            try:
                batch = self.codec.read(head, where, self.reader.pid, self.pin)
            except OSError as err:  # rank 0 died or its buffer vanished
                raise RuntimeError(f"dispatch_batches: reading rank 0's memory failed: {err}") from err
        else:
            buf = torch.empty(record.total, dtype=torch.uint8, pin_memory=self.pin)
            copy_bytes(buf, view)
            batch = self.codec.decode(buf, record.header)
        self.reader.release()
        return batch


def _wait(items: list[tuple[int, Any, torch.Tensor]]) -> None:
    for dst, work, _ in items:
        try:
            work.wait()
        except RuntimeError as err:
            raise RuntimeError(f"dispatch_batches: sending to rank {dst} failed: {err}") from err


_shared: dict[str, Any] = {"world": None, "group": None, "channels": 0}


def transfer_group() -> Any:
    """The gloo group all of this process's channels share: the default group when it is gloo,
    else one gloo group made on first use; collective on first use.

    A group per channel would leave, for every loader ever prepared, a gloo thread that wakes
    about 100 times a second (each wake-up preempts rank 0's loading) and sockets that are never
    closed.
    """
    world = dist.group.WORLD
    if _shared["world"] is not world:
        own = dist.get_backend() == "gloo"
        _shared.update(world=world, group=world if own else dist.new_group(backend="gloo"), channels=0)
    return _shared["group"]


def local_route(group: Any, channel: Channel) -> None:
    """Connect rank 0 with every rank of its host through a ring, and find which of those may read
    its memory (see the module doc); collective over `group`. Ranks left out are reached over gloo."""
    rank, timeout = channel.rank, group_timeout(group)
    ring = rank == 0 and sys.platform.startswith("linux")
    listener, name = shm_ring.listen(dist.get_world_size(group)) if ring else (None, "")
    probe = torch.tensor(list(os.urandom(16)), dtype=torch.uint8)
    wanted = env.dispatch_cross_memory()
    cross = rank == 0 and wanted is not False
    if rank == 0 and wanted:
        cross_memory.allow_readers()
    offer: list[Any] = [
        socket.gethostname(),
        name,
        (probe.data_ptr(), probe.numpy().tobytes()) if cross else None,
    ]
    dist.broadcast_object_list(offer, src=0, group=group)
    host, name, probe_at = offer
    if rank and name and host == socket.gethostname():
        channel.reader = shm_ring.connect(name, rank, timeout)
    reader = channel.reader
    reads = reader is not None and probe_at is not None and cross_memory.probe(reader.pid, *probe_at)
    routes: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(routes, (reader is not None, reads), group=group)
    channel.cross = frozenset(r for r, (_, can) in enumerate(routes) if can)
    if listener is not None:
        channel.writers = shm_ring.accept(listener, [r for r, (ok, _) in enumerate(routes) if ok], timeout)


def open_channel(num_processes: int, rank: int, pin: bool) -> Channel:
    """Every rank's end of a new channel; collective (every rank opens its channels in the same order)."""
    if num_processes == 1:
        return Channel(None, rank, pin)
    group = transfer_group()
    _shared["channels"] += 1
    channel = Channel(group, rank, pin, _TAG_BASE + _shared["channels"])
    local_route(group, channel)
    return channel
