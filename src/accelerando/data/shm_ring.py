"""A ring of shared-memory buffers from rank 0 to one receiver on its host (Linux).

Rank 0 copies a message into one of `SLOTS` anonymous shared buffers (`memfd`) and sends a small
control record over a Unix socket; the receiver copies the message out and acknowledges it on the
same socket, which frees the slot. A new or grown buffer travels as a file descriptor with the
record that first uses it, so nothing is ever named in `/dev/shm` and a killed job leaves nothing.

Every wait blocks in `select` on the socket, with a deadline, and checks the peer every
`_CHECK_SECONDS`: a peer that exits closes its end (the wait wakes at once), and one whose socket
outlives it in a forked child is caught by its process id. Linux only, as `/dev/shm` was.
"""

from __future__ import annotations

import mmap
import os
import select
import socket
import struct
import time
from collections import deque
from typing import Any, NamedTuple

import torch

SLOTS = 4  # buffers rank 0 may fill ahead of a receiver
_CHECK_SECONDS = 0.5
_ACK = b"\x01"
_PARAM = os.sched_param(0)
# Map the ring's pages at once: touched one by one, a fresh ring costs rank 0 one page fault per
# 4 KiB (about 770 faults, 3.5 ms, for the benchmark's 786 KB batches), paid inside its first rounds.
_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)


class Record(NamedTuple):
    """The control record that announces every message from rank 0, on every route (the ring's
    socket, gloo): one definition, packed and unpacked by the same `struct`."""

    kind: int  # transport's BATCH, END or REMOTE
    header: int  # bytes of the pickled structure at the start of the message
    total: int  # bytes of the message
    mark: int  # what follows the batch (transport's MORE, UNKNOWN, or the final remainder)
    slot: int  # the ring slot holding the message; -1: none (an end, or a message over gloo)
    pass_id: int  # the pass the message belongs to: a receiver drops those of passes left early

    def pack(self) -> bytes:
        return _RECORD.pack(*self)

    @classmethod
    def unpack(cls, data: bytes) -> Record:
        return cls(*_RECORD.unpack(data))


_RECORD = struct.Struct("<6q")
RECORD_SIZE = _RECORD.size


def _alive(pid: int) -> bool:
    """False once process `pid` has exited (a zombie counts as gone); True when it cannot tell."""
    if pid <= 0:  # the peer is in another pid namespace: rely on its socket closing
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except (OSError, IndexError):
        return False


class _End:
    """One end of the socket, with the peer it talks to and how long it may wait for it."""

    def __init__(self, sock: socket.socket, peer: str, timeout: float) -> None:
        sock.setblocking(False)
        self.sock, self.peer, self.timeout = sock, peer, timeout
        self.pid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]

    def closed(self) -> RuntimeError:
        return RuntimeError(f"dispatch_batches: {self.peer} closed the data channel (it exited or failed)")

    def wait(self, writing: bool = False) -> None:
        """Block until the socket is readable (writable), the peer is gone, or the deadline passes.

        The thread waits as `SCHED_BATCH`: the peer's send then wakes it without preempting the
        peer (a woken normal thread preempts its waker; on a shared core that stalled rank 0's
        loading at every message, 1-2 ms a send under load).
        """
        end = time.monotonic() + self.timeout
        want = ([], [self.sock]) if writing else ([self.sock], [])
        batch = os.sched_getscheduler(0) == os.SCHED_OTHER
        if batch:
            try:
                os.sched_setscheduler(0, os.SCHED_BATCH, _PARAM)
            except OSError:  # a sandbox that forbids it: wait as a normal thread
                batch = False
        try:
            while not any(select.select(*want, [], _CHECK_SECONDS)[:2]):
                if not _alive(self.pid):
                    raise RuntimeError(f"dispatch_batches: {self.peer} (process {self.pid}) died")
                if time.monotonic() > end:
                    raise TimeoutError(
                        f"dispatch_batches: {self.peer} did not answer for {self.timeout:.0f} s"
                    )
        finally:
            if batch:
                os.sched_setscheduler(0, os.SCHED_OTHER, _PARAM)

    def io(self, call: Any, *args: Any, writing: bool = False, wait: bool = True) -> Any:
        """`call(*args)` on the socket, waiting while it would block (None at once when not `wait`);
        a peer that closed its end raises naming it."""
        while True:
            try:
                out = call(*args)
            except BlockingIOError:
                if not wait:
                    return None
                self.wait(writing)
                continue
            except (BrokenPipeError, ConnectionResetError):
                raise self.closed() from None
            if out == b"" or (isinstance(out, tuple) and out[0] == b""):
                raise self.closed()
            return out


def _shared_buffer(size: int) -> tuple[int, torch.Tensor]:
    fd = os.memfd_create("accelerando-dispatch", os.MFD_CLOEXEC)
    os.ftruncate(fd, size)
    return fd, torch.frombuffer(mmap.mmap(fd, size, flags=_FLAGS), dtype=torch.uint8)


def _map(fd: int) -> torch.Tensor:
    try:
        return torch.frombuffer(mmap.mmap(fd, os.fstat(fd).st_size, flags=_FLAGS), dtype=torch.uint8)
    finally:
        os.close(fd)


class RingWriter(_End):
    """Rank 0's end towards one receiver: at most `SLOTS` messages unread, each slot reused once read."""

    def __init__(self, sock: socket.socket, peer: str, timeout: float) -> None:
        super().__init__(sock, peer, timeout)
        self.buffers: list[torch.Tensor | None] = [None] * SLOTS
        self.new_fd: list[int | None] = [None] * SLOTS  # buffer not yet sent to the receiver
        self.held: list[Any] = [None] * SLOTS  # what a message points at, kept until it is read
        self.unread: deque[int] = deque()  # slots of the messages sent and not yet acknowledged
        self.sent = 0

    def reclaim(self) -> None:
        """Take the receiver's acknowledgements without waiting; free what it has read."""
        while self.unread and self.io(self.sock.recv, 64, wait=False):
            self.held[self.unread.popleft()] = None

    def _wait_until(self, unread: int) -> None:
        """Take acknowledgements only when more than `unread` messages are out (a look costs a
        system call), waiting for them if need be."""
        if len(self.unread) > unread:
            self.reclaim()
        while len(self.unread) > unread:
            self.wait()
            self.reclaim()

    def wait_read(self) -> None:
        """Block until the receiver has read every message sent."""
        self._wait_until(0)

    def reserve(self, size: int) -> tuple[int, torch.Tensor]:
        """(slot, buffer of `size` bytes) for the next message, once the receiver freed that slot."""
        self._wait_until(SLOTS - 1)
        slot = self.sent % SLOTS
        buf = self.buffers[slot]
        if buf is None or buf.numel() < size:
            self.new_fd[slot], buf = _shared_buffer(max(size + size // 4, 1 << 16))
            self.buffers[slot] = buf
        return slot, buf[:size]

    def post(self, record: Record, keep: Any = None) -> None:
        """Send a control record (with its slot's new buffer, if any); `keep` lives until it is read."""
        slot = record.slot
        fd = self.new_fd[slot] if slot >= 0 else None
        if fd is None:
            self.io(self.sock.send, record.pack(), writing=True)
        else:
            self.io(socket.send_fds, self.sock, [record.pack()], [fd], writing=True)
            os.close(fd)
            self.new_fd[slot] = None
        if slot >= 0:
            self.sent += 1
            self.held[slot] = keep
            self.unread.append(slot)


class RingReader(_End):
    """A receiver's end: control records in order, and the buffers they name."""

    def __init__(self, sock: socket.socket, timeout: float) -> None:
        super().__init__(sock, "rank 0", timeout)
        self.buffers: list[torch.Tensor | None] = [None] * SLOTS

    def recv(self) -> Record:
        """The next control record; maps the buffer that comes with it."""
        data, fds, _, _ = self.io(socket.recv_fds, self.sock, RECORD_SIZE, 1)
        record = Record.unpack(data)
        if fds:
            self.buffers[record.slot] = _map(fds[0])
        return record

    def view(self, slot: int, size: int) -> torch.Tensor:
        return self.buffers[slot][:size]  # type: ignore[index]

    def release(self) -> None:
        """Give the slot of the message read last back to rank 0."""
        self.io(self.sock.send, _ACK, writing=True)


def listen(backlog: int) -> tuple[socket.socket, str]:
    """Rank 0's listening socket, in the abstract namespace (no file), and its name."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    name = f"\0accelerando-{os.urandom(8).hex()}"
    sock.bind(name)
    sock.listen(backlog)
    return sock, name


def connect(name: str, rank: int, timeout: float) -> RingReader | None:
    """A receiver's end of rank 0's ring, or None when rank 0's socket is out of reach."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.connect(name)
        sock.send(struct.pack("<q", rank))
    except OSError:
        sock.close()
        return None
    return RingReader(sock, timeout)


def accept(listener: socket.socket, ranks: list[int], timeout: float) -> dict[int, RingWriter]:
    """Rank 0: a writer for each of `ranks` (each has connected and said its rank)."""
    listener.settimeout(timeout)
    writers = {}
    for _ in ranks:
        sock, _ = listener.accept()
        sock.settimeout(timeout)
        rank = struct.unpack("<q", sock.recv(8))[0]
        writers[rank] = RingWriter(sock, f"rank {rank}", timeout)
    listener.close()
    return writers
