"""A ring of shared-memory buffers from rank 0 to one receiver on its host, with a named pipe
for the control messages and two shared counters: messages sent, and messages consumed.

Rank 0 runs at most `SLOTS` messages ahead; a slot (and the tensors a cross-memory message pointed
at) is released only once read. Files are unlinked as soon as the receiver has them open, so a
killed job leaves nothing in `/dev/shm`.
"""

from __future__ import annotations

import os
import select
import struct
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch

SLOTS = 4  # buffers rank 0 may fill ahead of a receiver
SHM_DIR = "/dev/shm"
CTRL = struct.Struct("<8q")  # kind, header, total, remainder, seq, slot, generation, pass
_POLL_INTERVAL, _POLL_SECONDS = 20e-6, 5e-3  # a waiting receiver polls this long before it blocks
_CONSUMED, _SENT = 0, 1  # the shared counters


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

    ack: Any  # a numpy view of the shared counters (reads in 0.1 us, a tensor's in 1 us)
    seq: int = 0
    freed: int = 0
    held: list[list[torch.Tensor]] = field(default_factory=lambda: [[] for _ in range(SLOTS)])

    def unread(self) -> bool:
        return int(self.ack[_CONSUMED]) < self.seq

    def reclaim(self) -> None:
        """Drop what the receiver has read, early: the loader's next batch may reuse that warm memory."""
        read = int(self.ack[_CONSUMED])
        while self.freed < read:
            self.held[self.freed % SLOTS] = []
            self.freed += 1


_ORPHANS: list[_Ring] = []  # rings of dropped channels whose receiver may still be reading them


def _prune_orphans() -> None:
    _ORPHANS[:] = [ring for ring in _ORPHANS if ring.unread()]


def _close(fd: int, paths: set[str], ring: _Ring) -> None:
    os.close(fd)
    _unlink_all(paths)
    if ring.unread() and any(ring.held):
        _ORPHANS.append(ring)  # a receiver may still copy these out of our memory


class ShmWriter:
    """Rank 0's ring of shared-memory buffers towards one receiver, plus a named pipe for control.

    The receiver writes how many messages it has consumed into a shared counter; a slot is reused
    only after its previous message was read (rank 0 runs at most `SLOTS` messages ahead), and
    only then are the tensors a cross-memory message pointed at released, even if the channel is
    dropped meanwhile.
    """

    def __init__(self, base: str) -> None:
        _prune_orphans()
        self.base = base
        self.paths: set[str] = set()
        ack = _create(f"{base}-ack", 16).view(torch.int64).numpy()
        self.paths.add(f"{base}-ack")
        ack[:] = 0
        self.ring = _Ring(ack)
        os.mkfifo(f"{base}-ctl")  # control messages, in order, one atomic write each
        self.paths.add(f"{base}-ctl")
        self.fd = os.open(f"{base}-ctl", os.O_RDWR)
        self.views: list[torch.Tensor | None] = [None] * SLOTS
        self.arrays: list[Any] = [None] * SLOTS  # the same buffers as numpy arrays (cheap writes)
        self.gens = [0] * SLOTS
        self.fresh: dict[str, int] = {}  # slot file -> first message using it; unlinked once read
        self._finalizer = weakref.finalize(self, _close, self.fd, self.paths, self.ring)

    def forget(self, path: str) -> None:
        """Unlink a file the receiver has opened: the mappings live on, and a killed job leaves
        nothing in /dev/shm."""
        if path in self.paths:
            os.unlink(path)
            self.paths.discard(path)

    def control(self, values: list[int]) -> None:
        os.write(self.fd, CTRL.pack(*values))  # 64 bytes < PIPE_BUF: one atomic write
        self.ring.ack[_SENT] += 1  # after the write: a receiver that sees the count finds the message

    def wait_read(self) -> None:
        """Block until the receiver has consumed every message sent so far."""
        while self.ring.unread():
            time.sleep(_POLL_INTERVAL)
        self._forget_read()

    def _forget_read(self) -> None:
        """Unlink the slot files the receiver has read a message in (it has them mapped), so that
        a job killed later (between passes, or by torchrun after another rank failed) leaves none."""
        for path, first in list(self.fresh.items()) if self.fresh else ():
            if first < int(self.ring.ack[_CONSUMED]):
                self.forget(path)
                del self.fresh[path]

    def slot(self, size: int) -> tuple[int, int, int, torch.Tensor]:
        """(seq, slot, generation, buffer) for the next message, once the receiver freed that slot."""
        ring = self.ring
        seq, slot = ring.seq, ring.seq % SLOTS
        while int(ring.ack[_CONSUMED]) < seq - SLOTS + 1:
            time.sleep(_POLL_INTERVAL)
        ring.reclaim()
        self._forget_read()
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


class ShmReader:
    def __init__(self, base: str, spin: bool = False) -> None:
        """Open rank 0's pipe and counters (they exist: the channel's creators met at a barrier).

        `spin`: wait for a message by reading the shared counter in a loop rather than sleeping
        between checks; only right when this process has a core of its own.
        """
        self.base = base
        self.ack = _map(f"{base}-ack", 16).view(torch.int64).numpy()
        self.fd = os.open(f"{base}-ctl", os.O_RDONLY | os.O_NONBLOCK)
        weakref.finalize(self, os.close, self.fd)
        self.maps: dict[int, tuple[int, torch.Tensor]] = {}
        self.spin = spin
        self.taken = 0  # control messages read so far

    def control(self) -> tuple[int, ...]:
        """The next control message. Poll the shared count of messages sent, then block in
        `select`: a reader blocked in the kernel is woken by rank 0's `write`, and the scheduler
        then often runs it on rank 0's core, stalling the loader. A sleeping poll costs rank 0 too
        (each wake-up is a timer interrupt and a context switch): with a core to itself the
        receiver spins instead."""
        deadline = time.monotonic() + _POLL_SECONDS
        while int(self.ack[_SENT]) <= self.taken:
            if time.monotonic() >= deadline:
                select.select([self.fd], [], [])
                break
            if not self.spin:
                time.sleep(_POLL_INTERVAL)
        data = _read_message(self.fd)
        self.taken += 1
        return CTRL.unpack(data)

    def release(self, seq: int) -> None:
        """Give the slot of message `seq` (and what it pointed at) back to rank 0."""
        self.ack[_CONSUMED] = seq + 1

    def view(self, slot: int, gen: int, total: int) -> torch.Tensor:
        cached = self.maps.get(slot)
        if cached is None or cached[0] != gen:
            path = f"{self.base}-{slot}-{gen}"
            cached = (gen, _map(path, os.path.getsize(path)))
            self.maps[slot] = cached
        return cached[1][:total]


def _read_message(fd: int) -> bytes:
    """One whole control message from the pipe (each was written by one atomic write)."""
    while True:
        try:
            data = os.read(fd, CTRL.size)
        except BlockingIOError:  # not expected: rank 0 raises the count only after its write
            select.select([fd], [], [])
            continue
        if not data:
            raise RuntimeError("dispatch_batches: rank 0 closed the data channel")
        return data
