"""Crash-safe checkpoint directories: stage beside the target, flush, write a manifest, rename.

A checkpoint is complete exactly when its `manifest.json` exists; the manifest is written last, after
every rank has flushed its files, and lists each file's size and CRC-32. `validate_checkpoint`
checks a directory against its manifest before anything is loaded from it.
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import zlib
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch.distributed as dist

from accelerando.checkpoint.confine import UnsafePathError, confined

MANIFEST_NAME = "manifest.json"
FORMAT_NAME = "accelerando.checkpoint"
FORMAT_VERSION = 1
STAGING_SUFFIX = ".incomplete"
VERIFY_MODES = ("full", "size", "none")


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be loaded: missing, incomplete, corrupt or mismatched."""


@dataclass(frozen=True)
class FileRecord:
    size: int
    crc32: str


@dataclass
class Manifest:
    files: dict[str, FileRecord]
    world_size: int = 1
    format: str = FORMAT_NAME
    version: int = FORMAT_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        files = {k: {"size": v.size, "crc32": v.crc32} for k, v in sorted(self.files.items())}
        body = {"format": self.format, "version": self.version, "world_size": self.world_size}
        return json.dumps({**body, "extra": self.extra, "files": files}, indent=1)

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        raw = json.loads(text)
        if raw.get("format") != FORMAT_NAME:
            raise CheckpointError(f"manifest format is {raw.get('format')!r}, expected {FORMAT_NAME!r}")
        files = {k: FileRecord(int(v["size"]), str(v["crc32"])) for k, v in raw["files"].items()}
        return cls(
            files, int(raw.get("world_size", 1)), raw["format"], int(raw["version"]), raw.get("extra", {})
        )


# ---- low-level file helpers ------------------------------------------------------------------
def crc32_file(path: str | os.PathLike[str]) -> str:
    """CRC-32 of a file's bytes (zlib releases the GIL, so several files hash in parallel)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return "00000000"
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            return f"{zlib.crc32(mm) & 0xFFFFFFFF:08x}"


def fsync_path(path: str | os.PathLike[str]) -> None:
    """Flush a file or a directory entry to the disk (a rename is durable only once its parent is)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _flush_and_record(path: Path) -> FileRecord:
    fsync_path(path)
    return FileRecord(path.stat().st_size, crc32_file(path))


# ---- process-group helpers (no-ops in a single process) --------------------------------------
def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


# `group`: None is the default group; an asynchronous save finishes on a group of its own, so its
# background thread never interleaves with the training loop's collectives.
def barrier(group: Any = None) -> None:
    if _distributed():
        dist.barrier(group=group)


def all_gather_object(obj: Any, group: Any = None) -> list[Any]:
    if not _distributed():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj, group=group)
    return out


def any_rank(flag: bool, group: Any = None) -> bool:
    """True on every rank when `flag` is true on at least one (keeps ranks in step after a failure)."""
    return any(all_gather_object(bool(flag), group))


# ---- staging ----------------------------------------------------------------------------------
def staging_path(target: Path) -> Path:
    """The same name on every rank, so they agree without talking; a stale one is a crashed save."""
    return target.parent / f".{target.name}{STAGING_SUFFIX}"


class StagedCheckpoint:
    """Files of one save, written into the staging directory and flushed in the background.

    Usage: every rank calls `write`/`track`; `publish` gathers the records, and the writer rank
    writes the manifest and renames the directory into place. `abort` leaves the target untouched.
    """

    def __init__(self, target: str | os.PathLike[str], *, is_writer: bool, workers: int = 2) -> None:
        self.target = Path(target).absolute()
        self.path = staging_path(self.target)
        self.is_writer = is_writer
        self.group: Any = None  # the process group publish and abort synchronise on
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ckpt-flush")
        self._pending: dict[str, Future[FileRecord]] = {}

    def open(self) -> StagedCheckpoint:
        targets = all_gather_object(str(self.target))  # also the barrier before staging starts
        if len(set(targets)) > 1:
            shown = ", ".join(f"rank {r}: {t}" for r, t in enumerate(targets))
            raise CheckpointError(
                f"every rank must save into the same directory, got {shown}; a checkpoint is one directory "
                "with one manifest (use a path every rank sees, or save_on_each_node for node-local disks)"
            )
        if self.is_writer:
            self.target.parent.mkdir(parents=True, exist_ok=True)
            if self.path.exists():
                shutil.rmtree(self.path)
            self.path.mkdir()
        barrier()
        return self

    def write(self, name: str, content: Any) -> None:
        """Write `name` inside the staging directory, then flush and hash it in the background.

        `content` is a callable `writer(path)`, or data saved with `torch.save` (loaded weights-only).
        """
        from accelerando.checkpoint.diskspace import reporting_space, serialized_size

        path = self.path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if callable(content):
            with reporting_space(path, lambda: _unmeasured(name)):
                content(path)
        else:
            from accelerando.checkpoint.state_dict import write_data_file

            with reporting_space(path, lambda: serialized_size(content)):
                write_data_file(path, content)
        self.track(name)

    def track(self, name: str) -> None:
        """Record a file that some other code (DCP, a user hook) wrote into the staging directory."""
        self._pending[name] = self._pool.submit(_flush_and_record, self.path / name)

    def save_sharded(self, subdir: str, state: dict[str, Any], mine: Callable[[str], bool]) -> None:
        """DCP writes this rank's shards of `state` into `subdir`; the files `mine` accepts are tracked."""
        from accelerando.checkpoint.state_dict import save_sharded

        save_sharded(self.path / subdir, state)
        self.track_tree(subdir, mine)

    def track_tree(self, subdir: str, predicate: Callable[[str], bool] = lambda _: True) -> None:
        for root, _, files in os.walk(self.path / subdir):
            for fname in files:
                rel = str((Path(root) / fname).relative_to(self.path))
                if predicate(fname):
                    self.track(rel)

    def records(self) -> dict[str, FileRecord]:
        return {name: fut.result() for name, fut in self._pending.items()}

    def publish(self, world_size: int, extra: dict[str, Any], untracked_ok: bool = False) -> Path:
        """Gather every rank's records, write the manifest last and rename into place (writer rank).

        A file that failed to flush on any rank (ENOSPC can surface at fsync) aborts the save.
        """
        error: BaseException | None = None
        try:
            local = self.records()
        except Exception as err:  # noqa: BLE001 - every rank must learn of it before anyone publishes
            error, local = err, {}
        self._pool.shutdown()
        parts = all_gather_object((local, error is not None), self.group)
        if len(parts) != world_size:
            # The gather reached fewer ranks than the checkpoint is for: the process group was
            # destroyed under this save (a rank whose training loop failed tears it down while its
            # asynchronous save is still finishing), so the collectives above ran as if alone. The
            # other ranks' files may be missing: a manifest written now would make them look complete.
            self.abort()
            raise CheckpointError(
                f"{str(self.target)!r} was not published: the records of {len(parts)} of {world_size} "
                "ranks were gathered (the process group was destroyed before the save finished); "
                "the previous checkpoint is intact"
            )
        if any(failed for _, failed in parts):
            self.abort()
            if error is not None:
                raise error
            raise CheckpointError(f"another rank failed to flush its files for {str(self.target)!r}")
        merged: dict[str, FileRecord] = {}
        for part, _ in parts:
            merged.update(part)
        if self.is_writer:
            if not untracked_ok:
                self._track_writer_extras(merged)
            manifest = Manifest(merged, world_size=world_size, extra=extra)
            tmp = self.path / (MANIFEST_NAME + ".tmp")
            tmp.write_text(manifest.to_json())
            fsync_path(tmp)
            os.replace(tmp, self.path / MANIFEST_NAME)
            fsync_path(self.path)
            _swap_into_place(self.path, self.target)
        barrier(self.group)
        return self.target

    def _track_writer_extras(self, merged: dict[str, FileRecord]) -> None:
        """Files a user hook dropped into the staging directory are covered by the manifest too."""
        for root, _, files in os.walk(self.path):
            for fname in files:
                rel = str((Path(root) / fname).relative_to(self.path))
                if rel not in merged and rel != MANIFEST_NAME:
                    merged[rel] = _flush_and_record(self.path / rel)

    def abort(self) -> None:
        """Stop without publishing (every rank calls it): the previous checkpoint stays, and the
        staging directory is removed, so a save that failed on a full disk does not keep it full."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        barrier(self.group)  # no rank still writes into the staging directory
        if self.is_writer:
            shutil.rmtree(self.path, ignore_errors=True)
        barrier(self.group)  # and on every rank it is gone when save_state raises


def _unmeasured(name: str) -> int:
    raise ValueError(f"the size of {name} is known only to its writer")


def write_file_atomically(target: str | os.PathLike[str], write: Callable[[Path], None]) -> None:
    """`write(tmp)` beside `target`, flush, rename: a reader sees the old file or the whole new one."""
    target = Path(target)
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}"
    try:
        write(tmp)
        fsync_path(tmp)
        os.replace(tmp, target)
        fsync_path(target.parent)
    finally:
        if tmp.exists():
            tmp.unlink()


def publish_directory(staged: Path, target: Path) -> None:
    """Rename a finished staging directory into place (replacing an older `target`)."""
    fsync_path(staged)
    _swap_into_place(staged, target)


def _swap_into_place(staged: Path, target: Path) -> None:
    """Rename `staged` to `target`; an existing target is moved aside first and removed after."""
    old = target.parent / f".{target.name}.old"
    if old.exists():
        shutil.rmtree(old)
    if target.exists():
        os.replace(target, old)
    os.replace(staged, target)
    fsync_path(target.parent)
    if old.exists():
        shutil.rmtree(old)


# ---- validation --------------------------------------------------------------------------------
def is_complete(path: str | os.PathLike[str]) -> bool:
    return (Path(path) / MANIFEST_NAME).is_file()


def read_manifest(path: str | os.PathLike[str]) -> Manifest:
    directory = Path(path)
    if not directory.is_dir():
        raise CheckpointError(f"checkpoint directory {str(directory)!r} does not exist")
    manifest_file = directory / MANIFEST_NAME
    if not manifest_file.is_file():
        raise CheckpointError(
            f"checkpoint {str(directory)!r} is incomplete: it has no {MANIFEST_NAME} (the save did not "
            "finish, or another tool wrote it; load_state(..., verify='none') loads it unchecked)"
        )
    try:
        return Manifest.from_json(manifest_file.read_text())
    except (ValueError, KeyError, TypeError) as err:
        raise CheckpointError(
            f"checkpoint {str(directory)!r} has an unreadable {MANIFEST_NAME}: {err}"
        ) from err


def validate_checkpoint(path: str | os.PathLike[str], verify: str = "full", workers: int = 2) -> Manifest:
    """Check every file named by the manifest: present, right size and (verify='full') right CRC-32.

    Raises CheckpointError naming every missing or damaged file; touches nothing else.
    """
    if verify not in VERIFY_MODES:
        raise ValueError(f"verify={verify!r} is not one of {VERIFY_MODES}")
    directory = Path(path)
    manifest = read_manifest(directory)
    problems: list[str] = []
    to_hash: list[str] = []
    for name, record in sorted(manifest.files.items()):
        try:
            file = confined(directory, name, f"{str(directory / MANIFEST_NAME)!r}")
        except UnsafePathError as err:
            raise CheckpointError(str(err)) from err
        if not file.is_file():
            problems.append(f"missing file {name!r}")
        elif file.stat().st_size != record.size:
            problems.append(f"{name!r} has {file.stat().st_size} bytes, the manifest says {record.size}")
        elif verify == "full":
            to_hash.append(name)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        sums = dict(zip(to_hash, pool.map(lambda n: crc32_file(directory / n), to_hash)))
    problems += [
        f"{n!r} is corrupt (CRC-32 mismatch)" for n, s in sums.items() if s != manifest.files[n].crc32
    ]
    if problems:
        raise CheckpointError(f"checkpoint {str(directory)!r} is damaged: " + "; ".join(problems))
    return manifest
