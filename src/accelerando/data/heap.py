"""Keeping the memory of freed batches in the process while a prepared loader runs.

glibc hands the free memory at the top of its heap back to the kernel once there is more of it
than a trim threshold, and the next batch then page-faults its way back in (about 4.6 µs a page
in the VM we measure on: up to a third of rank 0's loading time). The threshold adapts: glibc
raises it to twice the largest block, up to 32 MiB, that it has given back with `munmap`. A plain
loader frees one batch at a time and stays under it; a prepared loader frees a few at once (rank 0
of a dispatcher, a few rounds' worth) and crosses it on some rounds. `keep_freed` frees one
untouched block of the size the loader juggles, which moves glibc's threshold exactly as any
bigger tensor freed by a training step would. It changes no allocator setting, touches no page of
the block, and is bounded to 64 MiB kept.
"""

from __future__ import annotations

import platform
from typing import Any

import torch

from accelerando.ops.tree import tree_leaves

_ADAPTS_UP_TO = 32 << 20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit: larger blocks do not move it
_GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
_kept = 0


def keep_freed(nbytes: int) -> None:
    """Let glibc keep about `2 * nbytes` of freed memory (at most 64 MiB) instead of returning it."""
    global _kept
    nbytes = min(int(nbytes), _ADAPTS_UP_TO)
    if not _GLIBC or nbytes <= _kept:
        return
    block = torch.empty(nbytes, dtype=torch.uint8)  # above the threshold glibc maps it fresh: no page touched
    del block
    _kept = nbytes


def tensor_bytes(batch: Any) -> int:
    """Bytes of every CPU tensor in `batch`."""
    return sum(t.nbytes for t in tree_leaves(batch) if t.device.type == "cpu")
