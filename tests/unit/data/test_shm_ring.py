"""The shared-memory ring's control path, both ends in one process (a thread stands for rank 0)."""

from __future__ import annotations

import os
import sys
import threading
import time
import uuid

import pytest

from accelerando.data import shm_ring
from accelerando.data.shm_ring import SHM_DIR, ShmReader, ShmWriter

pytestmark = pytest.mark.skipif(
    not (sys.platform.startswith("linux") and os.path.isdir(SHM_DIR)), reason="needs /dev/shm"
)


def _pair(spin: bool) -> tuple[ShmWriter, ShmReader]:
    base = f"{SHM_DIR}/accelerando-test-{uuid.uuid4().hex[:12]}"
    writer = ShmWriter(base)
    return writer, ShmReader(base, spin=spin)


@pytest.mark.parametrize("spin", [False, True])
def test_messages_arrive_whole_and_in_order(spin: bool) -> None:
    writer, reader = _pair(spin)
    for i in range(5):
        writer.control([i, 1, 2, 3, 4, 5, 6, 7])
    assert [reader.control()[0] for _ in range(5)] == list(range(5))


@pytest.mark.parametrize("spin", [False, True])
def test_a_reader_past_its_polling_window_blocks_until_the_message_comes(
    spin: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shm_ring, "_POLL_SECONDS", 0.01)
    writer, reader = _pair(spin)
    late = threading.Timer(0.2, writer.control, args=([9, 0, 0, 0, 0, 0, 0, 0],))
    start = time.monotonic()
    late.start()
    assert reader.control()[0] == 9
    assert time.monotonic() - start >= 0.19
    late.join()


def test_a_closed_channel_raises_instead_of_hanging(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shm_ring, "_POLL_SECONDS", 0.01)
    writer, reader = _pair(spin=True)
    writer._finalizer()  # what rank 0's exit does: its end of the pipe closes
    with pytest.raises(RuntimeError, match="closed the data channel"):
        reader.control()


def test_release_frees_the_slot_for_the_writer() -> None:
    writer, reader = _pair(spin=True)
    for _ in range(shm_ring.SLOTS):
        seq, *_ = writer.slot(16)
        writer.control([0, 0, 16, -1, seq, 0, 0, 0])
    assert writer.ring.unread()
    for _ in range(shm_ring.SLOTS):
        reader.release(reader.control()[4])
    assert not writer.ring.unread()


def test_slot_files_are_unlinked_once_read_and_the_pass_waited_for() -> None:
    """Nothing stays in /dev/shm after a pass (a job killed between passes skips every finalizer)."""
    writer, reader = _pair(spin=True)
    for opened in ("ack", "ctl"):  # as the channel does once every receiver has them open
        writer.forget(f"{writer.base}-{opened}")
    for payload in (b"first", b"second"):
        seq, slot, gen, view = writer.slot(len(payload))
        writer.arrays[slot][: len(payload)] = memoryview(payload)
        writer.control([0, 0, len(payload), -1, seq, slot, gen, 0])
    got = []
    for _ in range(2):
        _, _, total, _, seq, slot, gen, _ = reader.control()
        got.append(reader.view(slot, gen, total).numpy().tobytes())
        reader.release(seq)
    writer.wait_read()
    assert got == [b"first", b"second"]
    assert not [name for name in os.listdir(SHM_DIR) if name.startswith(os.path.basename(writer.base))]
