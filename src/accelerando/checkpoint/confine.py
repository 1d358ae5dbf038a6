"""Names read from a checkpoint's own files (manifest entries, index shards) must stay inside it.

A manifest or a safetensors index is data someone else may have written; an entry such as
`../../etc/passwd`, an absolute path, or a symlink pointing out of the folder would make a load read
(and checksum, or load as weights) a file that is not part of the checkpoint.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path


class UnsafePathError(ValueError):
    """An entry of a checkpoint file names a path outside the checkpoint folder."""


def confined(
    folder: str | os.PathLike[str], name: str, what: str, also_within: Iterable[str | os.PathLike[str]] = ()
) -> Path:
    """`folder / name`, refused unless `name` is relative, stays in `folder` once normalised, and
    resolves (symlinks followed) to a path inside `folder` or inside one of `also_within`.

    `what` names the file the entry came from, for the error (e.g. "manifest.json"). `also_within`
    exists for the Hugging Face cache, whose snapshot files are symlinks into its `blobs` folder.
    """
    base = Path(folder)
    normal = os.path.normpath(name) if name else ""
    if not normal or Path(name).is_absolute() or normal == ".." or normal.startswith(".." + os.sep):
        raise UnsafePathError(
            f"{what} entry {name!r} is not a relative path inside the folder {str(base)!r}; refused"
        )
    target = (base / normal).resolve()
    roots = [base.resolve(), *(Path(p).resolve() for p in also_within)]
    if not any(target == root or root in target.parents for root in roots):
        raise UnsafePathError(
            f"{what} entry {name!r} leads outside the folder {str(base)!r} (to {str(target)!r}, through a "
            "symlink); refused"
        )
    return base / normal
