"""The shared-memory ring, both ends in one process (a thread stands for rank 0 where one must wait)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest
import torch

from accelerando.data import shm_ring
from accelerando.data.shm_ring import SLOTS, Record, RingReader, RingWriter

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")


def _pair(timeout: float = 30.0) -> tuple[RingWriter, RingReader]:
    listener, name = shm_ring.listen(1)
    reader = shm_ring.connect(name, 1, timeout)
    assert reader is not None
    return shm_ring.accept(listener, [1], timeout)[1], reader


def _post(writer: RingWriter, payload: bytes, kind: int = 0) -> None:
    slot, buf = writer.reserve(len(payload))
    buf.numpy()[:] = memoryview(payload)
    writer.post(Record(kind, 0, len(payload), -1, slot, 1))


def _take(reader: RingReader) -> bytes:
    record = reader.recv()
    out = reader.view(record.slot, record.total).numpy().tobytes()
    reader.release()
    return out


def test_record_is_one_struct_both_ways() -> None:
    record = Record(2, 10, 100, -2, 3, 7)
    assert Record.unpack(record.pack()) == record and len(record.pack()) == shm_ring.RECORD_SIZE


def test_messages_arrive_whole_and_in_order_through_growing_buffers() -> None:
    writer, reader = _pair()
    sent = [bytes([i]) * (1000 << i) for i in range(2 * SLOTS)]  # every slot grows once
    got = []
    for i, payload in enumerate(sent):
        _post(writer, payload)
        if i >= SLOTS - 1:
            got.append(_take(reader))
    got += [_take(reader) for _ in range(SLOTS - 1)]
    assert got == sent
    writer.wait_read()
    assert not writer.unread


def test_a_reader_blocks_until_the_message_comes() -> None:
    writer, reader = _pair()
    late = threading.Timer(0.2, _post, args=(writer, b"late"))
    start = time.monotonic()
    late.start()
    assert _take(reader) == b"late"
    assert time.monotonic() - start >= 0.19
    late.join()


def test_release_frees_the_slot_and_what_it_pointed_at() -> None:
    writer, reader = _pair()
    for _ in range(SLOTS):
        slot, _ = writer.reserve(16)
        writer.post(Record(0, 0, 16, -1, slot, 1), keep=torch.ones(1))
    assert len(writer.unread) == SLOTS and all(h is not None for h in writer.held)
    blocked = threading.Thread(target=writer.reserve, args=(16,))  # the ring is full: it waits
    blocked.start()
    blocked.join(0.2)
    assert blocked.is_alive()
    for _ in range(SLOTS):
        reader.recv()
        reader.release()
    blocked.join(5)
    assert not blocked.is_alive()
    writer.reclaim()
    assert not writer.unread and all(h is None for h in writer.held)


def test_a_closed_channel_raises_instead_of_hanging() -> None:
    writer, reader = _pair()
    writer.sock.close()  # what rank 0's exit does
    with pytest.raises(RuntimeError, match="rank 0 closed the data channel"):
        reader.recv()
    writer, reader = _pair()
    _post(writer, b"x")
    reader.sock.close()  # a receiver that exits: rank 0 waiting for its slot hears it at once
    with pytest.raises(RuntimeError, match="rank 1 closed the data channel"):
        writer.wait_read()


def test_a_dead_peer_or_the_deadline_ends_a_wait() -> None:
    """A peer whose socket outlives it (a forked child keeps it) is caught by its process id."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    writer, reader = _pair()
    reader.pid = gone.pid
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=rf"rank 0 \(process {gone.pid}\) died"):
        reader.recv()
    assert time.monotonic() - start < 3
    writer, reader = _pair(timeout=0.1)
    with pytest.raises(TimeoutError, match="rank 0 did not answer"):
        reader.recv()


def test_nothing_is_left_in_dev_shm() -> None:
    """The buffers are anonymous (memfd): a job killed at any moment leaves no file behind."""
    before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    writer, reader = _pair()
    _post(writer, b"payload")
    assert _take(reader) == b"payload"
    after = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    assert not {name for name in after - before if name.startswith("accelerando")}
