"""Reading another local process's memory directly (Linux `process_vm_readv`, "cross-memory attach").

MPI libraries move large intra-node messages this way: the receiver copies straight out of the
sender's buffer, so a message costs one copy, made by the receiver, and the sender copies nothing.
`dispatch_batches` uses it so that rank 0, which loads every rank's data, spends no time copying
other ranks' batches. It needs Linux and ptrace permission between the two processes (same user;
under Yama `ptrace_scope=1` the sender opts in with `allow_readers`); `probe` tells whether it works.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys
from collections.abc import Sequence

import torch

_PR_SET_PTRACER = 0x59616D61
_PR_SET_PTRACER_ANY = ctypes.c_ulong(-1).value
_IOV_MAX = 1024


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.process_vm_readv  # noqa: B018 - missing in old C libraries
    except (OSError, AttributeError):
        return None
    libc.process_vm_readv.restype = ctypes.c_ssize_t
    return libc


_LIBC = _libc()


def allow_readers() -> None:
    """Let other processes of this user read this one (needed under Yama ptrace_scope=1)."""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PTRACER, _PR_SET_PTRACER_ANY, 0, 0, 0)  # harmless where Yama is absent


def read(pid: int, remote: Sequence[tuple[int, int]], local: Sequence[torch.Tensor]) -> None:
    """Fill each contiguous CPU tensor of `local` from the matching `(address, nbytes)` of process `pid`."""
    if _LIBC is None:
        raise OSError(errno.ENOSYS, "process_vm_readv is not available on this system")
    pairs = [(addr, n, t.data_ptr()) for (addr, n), t in zip(remote, local) if n]
    for start in range(0, len(pairs), _IOV_MAX):
        chunk = pairs[start : start + _IOV_MAX]
        src = (_IoVec * len(chunk))(*[_IoVec(a, n) for a, n, _ in chunk])
        dst = (_IoVec * len(chunk))(*[_IoVec(d, n) for _, n, d in chunk])
        want = sum(n for _, n, _ in chunk)
        got = _LIBC.process_vm_readv(pid, dst, len(chunk), src, len(chunk), 0)
        if got < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"process_vm_readv from pid {pid}: {os.strerror(err)}")
        if got != want:  # only a vanished or remapped buffer reads short
            raise OSError(errno.EIO, f"process_vm_readv from pid {pid}: read {got} of {want} bytes")


def probe(pid: int, address: int, expected: bytes) -> bool:
    """True when this process can read `expected` at `address` in process `pid`."""
    out = torch.empty(len(expected), dtype=torch.uint8)
    try:
        read(pid, [(address, len(expected))], [out])
    except OSError:
        return False
    return bytes(out.numpy().tobytes()) == expected
