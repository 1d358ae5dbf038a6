"""Automatic checkpoint names (`<project_dir>/checkpoints/checkpoint_<iteration>`) and retention."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from accelerando.checkpoint.atomic import fsync_path, is_complete

CHECKPOINTS_DIR = "checkpoints"
_NAME = re.compile(r"^checkpoint_(\d+)$")
_LEFTOVER = re.compile(r"^\.checkpoint_\d+\.(incomplete|deleting)$")


def checkpoints_root(project_dir: str | os.PathLike[str] | None) -> Path:
    if not project_dir:
        raise ValueError(
            "automatic_checkpoint_naming needs a project directory: pass "
            "ProjectConfiguration(project_dir=..., automatic_checkpoint_naming=True) or Accelerator(project_dir=...)"
        )
    return Path(project_dir) / CHECKPOINTS_DIR


def checkpoint_name(iteration: int) -> str:
    return f"checkpoint_{iteration}"


def list_checkpoints(root: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """Complete automatic checkpoints under `root`, oldest first (staging directories are skipped)."""
    base = Path(root)
    if not base.is_dir():
        return []
    found = []
    for entry in base.iterdir():
        match = _NAME.match(entry.name)
        if match and entry.is_dir() and is_complete(entry):
            found.append((int(match.group(1)), entry))
    return sorted(found)


def leftovers(root: str | os.PathLike[str]) -> list[Path]:
    """Folders a killed save or removal left under `root`: `.checkpoint_N.incomplete` / `.deleting`."""
    base = Path(root)
    if not base.is_dir():
        return []
    return sorted(entry for entry in base.iterdir() if entry.is_dir() and _LEFTOVER.match(entry.name))


def latest_checkpoint(root: str | os.PathLike[str]) -> Path | None:
    found = list_checkpoints(root)
    return found[-1][1] if found else None


def remove_checkpoint(path: Path) -> None:
    """Rename first, then delete: a crash half-way never leaves a damaged directory that looks complete."""
    doomed = path.parent / f".{path.name}.deleting"
    if doomed.exists():
        shutil.rmtree(doomed)
    os.replace(path, doomed)
    fsync_path(path.parent)
    shutil.rmtree(doomed)


def enforce_total_limit(root: str | os.PathLike[str], total_limit: int | None) -> list[Path]:
    """Delete the oldest complete checkpoints beyond `total_limit`; incomplete ones are never counted."""
    if total_limit is None:
        return []
    found = list_checkpoints(root)
    removed = []
    for _, path in found[: max(0, len(found) - total_limit)]:
        remove_checkpoint(path)
        removed.append(path)
    return removed
