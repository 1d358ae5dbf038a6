"""A full disk during a save, said plainly: which file, how many bytes it needs, how many are free.

torch's zip writer reports a failed write as `[enforce fail at inline_container.cc] unexpected pos`,
losing the OS error; our writers go through Python file objects, so the `OSError` (ENOSPC, EDQUOT,
or EFBIG under a file-size limit) survives in the exception chain and is found here.
"""

from __future__ import annotations

import errno
import io
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, cast

import torch

SPACE_ERRNOS = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "no space left: disk quota exceeded",
    errno.EFBIG: "no space left under this process's file size limit (ulimit -f)",
}


class OutOfSpaceError(OSError):
    """A checkpoint file could not be written for lack of space; `filename` names it."""


def space_errno(err: BaseException | None) -> int | None:
    """The space-related errno anywhere in `err`'s cause/context chain, else None."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in SPACE_ERRNOS:
            return int(err.errno)
        err = err.__cause__ or err.__context__
    return None


class _CountingSink(io.RawIOBase):
    """A writable stream that keeps only the number of bytes written to it."""

    def __init__(self) -> None:
        self.count = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        n = memoryview(data).nbytes
        self.count += n
        return n


def serialized_size(obj: Any) -> int:
    """How many bytes `torch.save(obj)` writes, measured without touching a disk."""
    sink = _CountingSink()
    torch.save(obj, cast(IO[bytes], sink))
    return sink.count


def free_bytes(path: Path) -> int:
    """Free bytes on the filesystem holding `path` (its nearest existing ancestor)."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return shutil.disk_usage(candidate).free
    return 0


@contextmanager
def reporting_space(path: Path, needed: Callable[[], int]) -> Iterator[None]:
    """Turn a failed write of `path` for lack of space into `OutOfSpaceError`; the partial file is removed.

    `needed()` is called only on failure (it may serialize again to count the bytes).
    """
    try:
        yield
    except Exception as err:
        code = space_errno(err)
        if code is None or isinstance(err, OutOfSpaceError):
            raise
        path.unlink(missing_ok=True)
        try:
            size = f"it needs {needed():,} bytes"
        except Exception:  # noqa: BLE001 - the size is a detail; the error itself must still be clear
            size = "its size could not be measured"
        message = f"{SPACE_ERRNOS[code]} writing {path.name}: {size}, {free_bytes(path.parent):,} bytes are free there"
        raise OutOfSpaceError(code, message, str(path)) from err
