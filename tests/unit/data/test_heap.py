"""`heap.keep_freed`: freed batch memory stays in the process (no page faults to get it back)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from accelerando.data import heap

pytestmark = pytest.mark.skipif(not heap._GLIBC, reason="glibc's adaptive trim threshold")

_PROBE = """
import ctypes, sys, torch
from accelerando.data import heap

class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in "arena ordblks smblks hblks hblkhd usm fsm uord ford keep".split()]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
size = int(sys.argv[1])
if sys.argv[2] == "keep":
    heap.keep_freed(size)
mapped = libc.mallinfo2().hblks
block = torch.empty(size // 2, dtype=torch.uint8)
print(libc.mallinfo2().hblks > mapped)  # True: glibc maps it, and unmaps (gives back) when it is freed
"""


def _mapped(size: int, mode: str) -> bool:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, str(size), mode], capture_output=True, text=True, check=True, env=env
    )
    return out.stdout.split()[-1] == "True"


def test_keep_freed_raises_what_glibc_keeps_instead_of_giving_back() -> None:
    """glibc gives a block back to the kernel (and faults it in again next time) when it is above
    the adaptive threshold; keep_freed raises that threshold, and the trim threshold with it."""
    size = 16 << 20
    if not _mapped(size, "plain"):  # what an 8 MiB block gets by default after importing torch
        pytest.skip("glibc's threshold is above 8 MiB here already: nothing for keep_freed to raise")
    assert not _mapped(size, "keep"), "after keep_freed(16 MiB) it comes from (and stays in) the heap"


def test_keep_freed_is_bounded_and_done_once_per_size() -> None:
    before = heap._kept
    heap.keep_freed(1 << 40)  # a terabyte asks for no more than glibc adapts to
    assert heap._kept == max(before, 32 << 20)
    heap.keep_freed(1024)
    assert heap._kept == max(before, 32 << 20)
