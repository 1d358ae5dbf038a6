"""Moving one rank's batch from rank 0 to rank r for `dispatch_batches=True`.

Rank 0 loads every rank's data, so it must not also copy it:

- ranks on rank 0's host that may read its memory (`cross_memory`) get the structure and the
  tensors' addresses through a shared-memory ring (`shm_ring`) and copy the bytes out of rank 0
  themselves; rank 0 keeps those tensors alive until the receiver says it is done;
- other ranks on its host get the bytes copied into that ring (one copy each side);
- ranks on other hosts get both over gloo: the default group when it is gloo, else one gloo
  group that every channel of the process shares, each channel with its own message tag.

Every message is announced by an 8-int control message that carries the number of the pass it
belongs to, so a pass that was left early (a `break` on every rank) leaves nothing behind for the
next one.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from accelerando.config import env
from accelerando.data import cross_memory
from accelerando.data.batch_codec import RemoteCodec, decode, pack
from accelerando.data.shm_ring import CTRL, SHM_DIR, SLOTS, ShmReader, ShmWriter

_BATCH, _END, _REMOTE = 0, 1, 2  # bytes in the ring / end of pass / bytes read from rank 0
_TAG_BASE = 1 << 20  # gloo message tags of channel n are _TAG_BASE + n, clear of a user's own tags
# What a batch message says of the batches after it (>= 0: it is the rank's last; the final remainder)
UNKNOWN, MORE = -1, -2


@dataclass(frozen=True)
class EndMsg:
    """Tells a rank its pass is over, with the final batch's real-sample count for gather_for_metrics."""

    remainder: int


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
    where = (socket.gethostname(), os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK))
    everyone: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, where, group=group)
    host, ok = everyone[0]
    local = frozenset(r for r, (h, can) in enumerate(everyone) if r and ok and can and h == host)
    probe = torch.tensor(list(os.urandom(16)), dtype=torch.uint8)
    allowed = bool(local) and env.flag("DISPATCH_CROSS_MEMORY", default=True)
    if rank == 0 and allowed:
        cross_memory.allow_readers()
    offer: list[Any] = [
        uuid.uuid4().hex[:16],
        os.getpid(),
        probe.data_ptr(),
        probe.numpy().tobytes(),
        allowed,
    ]
    dist.broadcast_object_list(offer, src=0, group=group)
    token, pid, address, expected, allowed = offer
    can_read = allowed and rank in local and cross_memory.probe(pid, address, expected)
    dist.all_gather_object(everyone, can_read, group=group)
    cross = frozenset(r for r, yes in enumerate(everyone) if yes)
    return Plan(token, local, cross, pid)


class Channel:
    """Rank 0 -> rank r messages: an 8-int control message, then the batch (see the module doc).

    Both ends call `begin_pass` when a pass starts; rank 0 calls `end_pass` when it finishes one.
    """

    def __init__(self, group: Any, rank: int, plan: Plan, pin: bool, tag: int = _TAG_BASE) -> None:
        self.group, self.rank, self.pin, self.pid, self.tag = group, rank, pin, plan.pid, tag
        self.cross = plan.cross
        base = f"{SHM_DIR}/accelerando-{plan.token}"
        token = plan.token
        self.base = base if token else ""
        self.writers = {r: ShmWriter(f"{base}-{r}") for r in plan.local} if rank == 0 and token else {}
        self.reader: ShmReader | None = None
        self.local = plan.local
        self.pending: deque[list[Any]] = deque()
        self.pass_id = 0
        self.codec = RemoteCodec()

    def _connect(self) -> None:
        """Receivers open rank 0's files (they exist: every rank has created its channel)."""
        if self.rank in self.local and self.base:
            self.reader = ShmReader(f"{self.base}-{self.rank}", spin=_cores_for_everyone(len(self.local) + 1))

    def _connected(self) -> None:
        """Rank 0, once every receiver has connected: unlink the pipes and counters."""
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

    def send_round(self, messages: dict[int, Any], marks: dict[int, int] | None = None) -> None:
        """Send one message per destination rank: a batch, or an `EndMsg`. `marks[dst]` says what
        follows a batch: `UNKNOWN`, `MORE` batches, or nothing (the final remainder, >= 0)."""
        keep: list[Any] = []
        for dst, payload in messages.items():
            writer = self.writers.get(dst)
            mark = UNKNOWN if marks is None else marks.get(dst, UNKNOWN)
            if isinstance(payload, EndMsg):
                end = [_END, 0, 0, payload.remainder, -1, 0, 0, self.pass_id]
                if writer is not None:
                    writer.control(end)
                else:
                    ctrl = torch.tensor(end, dtype=torch.int64)
                    keep += [dist.isend(ctrl, dst, group=self.group, tag=self.tag), ctrl]
                continue
            if writer is not None and dst in self.cross:
                header, where, tensors = self.codec.pack(payload)
                total = len(header) + len(where)
                seq, slot, gen, view = writer.slot(total)
                writer.arrays[slot][:total] = memoryview(header + where)
                writer.ring.held[slot] = tensors
                writer.control([_REMOTE, len(header), total, mark, seq, slot, gen, self.pass_id])
                continue
            packed = pack(payload)
            if writer is not None:
                seq, slot, gen, view = writer.slot(packed.total)
                packed.write(view)
                writer.control([_BATCH, len(packed.header), packed.total, mark, seq, slot, gen, self.pass_id])
                continue
            buf = torch.empty(packed.total, dtype=torch.uint8)
            packed.write(buf)
            info = [_BATCH, len(packed.header), packed.total, mark, -1, 0, 0, self.pass_id]
            ctrl = torch.tensor(info, dtype=torch.int64)
            keep += [
                dist.isend(ctrl, dst, group=self.group, tag=self.tag),
                ctrl,
                dist.isend(buf, dst, group=self.group, tag=self.tag),
                buf,
            ]
        if keep:
            self.pending.append(keep)
        while len(self.pending) > SLOTS:
            _wait(self.pending.popleft())

    def flush(self) -> None:
        while self.pending:
            _wait(self.pending.popleft())

    def recv(self) -> tuple[bool, Any, int]:
        """(True, batch, its mark) or (False, None, remainder) when this rank's pass is over.

        Messages left from an earlier, abandoned pass are read and dropped.
        """
        while True:
            if self.reader is not None:
                kind, hlen, total, rem, seq, slot, gen, pass_id = self.reader.control()
            else:
                ctrl = torch.empty(CTRL.size // 8, dtype=torch.int64)
                dist.recv(ctrl, 0, group=self.group, tag=self.tag)
                kind, hlen, total, rem, seq, slot, gen, pass_id = (int(x) for x in ctrl.tolist())
            stale = pass_id < self.pass_id
            if kind == _END:
                if stale:
                    continue
                return False, None, rem
            if self.reader is None:
                buf = torch.empty(total, dtype=torch.uint8, pin_memory=self.pin and not stale)
                dist.recv(buf, 0, group=self.group, tag=self.tag)
                if stale:
                    continue
                return True, decode(buf, hlen), rem
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
            return True, batch, rem


def _cores_for_everyone(local_ranks: int) -> bool:
    """True when this host has a core for every rank of the job on it (so a receiver may spin)."""
    on_host = int(os.environ.get("LOCAL_WORLD_SIZE", local_ranks))
    return max(on_host, local_ranks) <= len(os.sched_getaffinity(0))


def _wait(items: list[Any]) -> None:
    for item in items:
        if not isinstance(item, torch.Tensor):
            item.wait()


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


def open_channel(num_processes: int, rank: int, pin: bool) -> Channel:
    """Every rank's end of a new channel; collective (every rank opens its channels in the same order)."""
    if num_processes == 1:
        return Channel(None, rank, Plan(), pin)
    group = transfer_group()
    _shared["channels"] += 1
    tag = _TAG_BASE + _shared["channels"]
    channel = Channel(group, rank, shared_memory_plan(group), pin, tag)
    dist.barrier(group=group)  # rank 0's pipes and buffers exist before anyone opens them
    channel._connect()
    dist.barrier(group=group)  # every receiver has them open: rank 0 may unlink them
    channel._connected()
    return channel
