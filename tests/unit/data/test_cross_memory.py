"""Cross-memory reads (process_vm_readv) against this process's own memory."""

from __future__ import annotations

import os
import sys

import pytest
import torch

from accelerando.data import cross_memory

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")


def test_read_copies_each_buffer_exactly() -> None:
    src = [torch.arange(1000, dtype=torch.float32), torch.tensor([7, 8, 9], dtype=torch.int64)]
    out = [torch.zeros_like(t) for t in src]
    cross_memory.read(os.getpid(), [(t.data_ptr(), t.numel() * t.element_size()) for t in src], out)
    assert all(torch.equal(a, b) for a, b in zip(src, out))


def test_read_of_an_unmapped_address_raises_instead_of_returning_garbage() -> None:
    with pytest.raises(OSError, match="process_vm_readv"):
        cross_memory.read(os.getpid(), [(8, 64)], [torch.empty(64, dtype=torch.uint8)])


def test_probe_checks_the_bytes() -> None:
    probe = torch.tensor(list(b"accelerando-probe"), dtype=torch.uint8)
    assert cross_memory.probe(os.getpid(), probe.data_ptr(), b"accelerando-probe")
    assert not cross_memory.probe(os.getpid(), probe.data_ptr(), b"something-else!!!")
    assert not cross_memory.probe(2**22, probe.data_ptr(), b"accelerando-probe")  # no such process
