"""`save_state(..., async_save=True)`: snapshot to host memory, write and publish in the background.

Why the snapshot is mostly taken later: the only thing that changes a model's parameters and its
optimizer's state between two saves is the optimizer step, so the caller's thread copies at once
only the tensors something else may change (buffers that a forward pass updates, the RNG, the
scheduler, gathered full state dicts) and lists the rest. The background thread copies those
while training runs its next forward and backward passes; a step pre-hook on every prepared
optimizer makes the next `optimizer.step()` wait until the copy is done. Every deferred tensor's
version counter is compared after its copy, so an in-place change that did not wait (a manual
`p.add_()` between the save and the step) fails the save instead of writing a mixed state.
Sharded (DCP) state is copied on the caller by DCP's own `DefaultStager`, the one
`torch.distributed.checkpoint.async_save` uses, and written by `dcp.save` from our thread (one
`async_save` per model and optimizer would run their collectives concurrently on one group).

The background thread then does what a synchronous save does after its writes: every rank agrees
the files are flushed, the writer writes the manifest last and renames the staging directory into
place, so the checkpoint appears only once complete. Its collectives run on a process group of their
own (gloo), so they never interleave with the training loop's. A failure on any rank aborts the
save on every rank (the staging directory is removed, the previous checkpoint stays) and is raised
by the next `save_state`, `load_state` or `end_training`, naming the checkpoint.
"""

from __future__ import annotations

import copy
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from accelerando.checkpoint import atomic, naming
from accelerando.checkpoint.atomic import CheckpointError, StagedCheckpoint

SUPPORTED_FORMATS = ("full", "sharded")  # StateIO names whose save goes through the stage only


class Snapshot:
    """One save's host copies that wait for the background thread, and the wait they cost training.

    `protected` holds the storages that only a hooked optimizer step changes (its parameters and
    state); a CPU tensor on one of them is copied by `fill` on the background thread, any other
    tensor at once.
    """

    def __init__(self, protected: set[int]) -> None:
        self.protected = protected
        self._later: list[tuple[torch.Tensor, torch.Tensor, int, str]] = []
        self.copied = threading.Event()
        self.waited_s = 0.0  # time optimizer steps spent waiting for `fill` (the stall it caused)

    def defers(self, src: torch.Tensor) -> bool:
        ptr = src.untyped_storage().data_ptr()
        return src.device.type == "cpu" and ptr != 0 and ptr in self.protected

    def later(self, src: torch.Tensor, buf: torch.Tensor, key: tuple[Any, ...]) -> None:
        self._later.append((src, buf, src._version, "/".join(map(str, key))))

    def fill(self) -> None:
        """Copy what was deferred (background thread); the copy is refused if training changed it."""
        try:
            for src, buf, version, name in self._later:
                buf.copy_(src)
                if src._version != version:
                    raise CheckpointError(
                        f"{name!r} was changed in place after save_state(async_save=True) returned and "
                        "before its host copy was taken; only optimizer.step() of a prepared optimizer "
                        "waits for the copy (change parameters by hand only before save_state, or "
                        "after an optimizer step)"
                    )
        finally:
            self._later.clear()  # no reference to live tensors outlives the copy
            self.copied.set()

    def wait(self) -> None:
        """Block until `fill` is done (the training thread, before an optimizer step)."""
        if not self.copied.is_set():
            start = time.perf_counter()
            self.copied.wait()
            self.waited_s += time.perf_counter() - start


def protected_storages(optimizers: list[torch.optim.Optimizer]) -> set[int]:
    """Storages of the parameters and state tensors that these optimizers' steps change."""
    out: set[int] = set()
    for opt in optimizers:
        tensors = [p for g in opt.param_groups for p in g["params"]]
        tensors += [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
        # a wrapper subclass (FSDP2's DTensor parameters) has no storage of its own; its state is
        # gathered or staged into fresh tensors, which are copied at once
        plain = (torch.Tensor, torch.nn.Parameter)
        out.update(t.untyped_storage().data_ptr() for t in tensors if type(t) in plain)
    out.discard(0)
    return out


class HostBuffers:
    """Host copies of state trees, into buffers kept from one asynchronous save to the next.

    Why: fresh host memory costs a page fault per page on first touch, which made the copy several
    times slower than the memory bandwidth allows; the second and later saves copy into the same
    buffers. Safe because a save starts only after the previous one finished writing (`wait`).
    The price: the buffers stay allocated between saves (see docs/checkpointing.md).
    """

    def __init__(self) -> None:
        self._store: dict[tuple[Any, ...], torch.Tensor] = {}
        self.stagers: dict[str, Any] = {}  # DCP's stagers, one per sharded folder
        self.snapshot: Snapshot | None = None  # the save being taken: copies it may defer
        # optimizer -> its step pre-hook's handle (weak: an id could be reused by a new optimizer)
        self.guarded: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()

    def copy(self, obj: Any, key: tuple[Any, ...] = ()) -> Any:
        """A copy of `obj` whose tensors share nothing with training (some filled by `Snapshot.fill`)."""
        if isinstance(obj, torch.Tensor):
            return self._tensor(obj.detach(), key)
        if isinstance(obj, dict):
            return {k: self.copy(v, (*key, k)) for k, v in obj.items()}
        if isinstance(obj, list | tuple):
            items = [self.copy(v, (*key, i)) for i, v in enumerate(obj)]
            return items if isinstance(obj, list) else tuple(items)
        return copy.deepcopy(obj)

    def _tensor(self, src: torch.Tensor, key: tuple[Any, ...]) -> torch.Tensor:
        if type(src) is not torch.Tensor:  # a subclass (DTensor) is copied as itself, unbuffered
            return src.to("cpu", copy=True)
        buf = self._store.get(key)
        if buf is None or (buf.shape, buf.stride(), buf.dtype) != (src.shape, src.stride(), src.dtype):
            buf = self._store[key] = torch.empty_like(src, device="cpu")
        snapshot = self.snapshot
        if snapshot is not None and snapshot.defers(src):
            snapshot.later(src, buf, key)
        else:
            buf.copy_(src)
        return buf

    def guard(self, optimizers: list[torch.optim.Optimizer], current: Callable[[], Snapshot | None]) -> None:
        """Make each optimizer's step wait for the copy of the snapshot being taken (hooked once)."""

        def before_step(*_: Any) -> None:
            snapshot = current()
            if snapshot is not None:
                snapshot.wait()

        for opt in optimizers:
            if opt not in self.guarded:
                self.guarded[opt] = opt.register_step_pre_hook(before_step)


class DeferredStage(StagedCheckpoint):
    """A staging directory whose writes are copied now and performed later, in order, by `flush`."""

    def __init__(
        self, target: str | Path, *, is_writer: bool, group: Any, buffers: HostBuffers, snapshot: Snapshot
    ) -> None:
        super().__init__(target, is_writer=is_writer)
        self.group = group
        self.buffers = buffers
        self.snapshot = snapshot
        self._queue: list[Callable[[], None]] = []
        self.host_bytes = 0  # what the snapshot holds in host memory (reported in the docs' terms)

    def write(self, name: str, content: Any) -> None:
        if not callable(content):
            content = self.buffers.copy(content, (name,))
            self.host_bytes += tensor_bytes(content)
        # a callable writer holds host copies already (the checkpointer copies the weights it writes)
        self._queue.append(lambda: StagedCheckpoint.write(self, name, content))

    def track(self, name: str) -> None:
        # Also reached from a queued write or DCP save while `flush` runs: the flush and hash then
        # join the end of the queue and run in the same flush, after the file is complete.
        self._queue.append(lambda: StagedCheckpoint.track(self, name))

    def save_sharded(self, subdir: str, state: dict[str, Any], mine: Callable[[str], bool]) -> None:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        stagers = self.buffers.stagers
        if subdir not in stagers:  # a DefaultStager keeps its host copy for the next save, like ours
            stagers[subdir] = DefaultStager(StagingOptions(False, False, False, False))  # synchronous
        staged = stagers[subdir].stage(state)
        self.host_bytes += tensor_bytes(staged)

        def run() -> None:
            import torch.distributed.checkpoint as dcp

            dcp.save(staged, checkpoint_id=str(self.path / subdir), process_group=self.group)
            StagedCheckpoint.track_tree(self, subdir, mine)

        self._queue.append(run)

    def flush(self) -> None:
        """Take the deferred copies, then perform the queued writes (background thread)."""
        self.snapshot.fill()
        while self._queue:
            self._queue.pop(0)()


def tensor_bytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        local = getattr(obj, "_local_tensor", obj)  # a DTensor holds this rank's shard
        return int(local.numel() * local.element_size())
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return sum(tensor_bytes(v) for v in obj)
    return 0


class PendingSave:
    """The background half of one asynchronous save; `result()` joins it and raises its failure."""

    def __init__(
        self,
        stage: DeferredStage,
        *,
        world_size: int,
        extra: dict[str, Any],
        root: Path | None,
        limit: int | None,
    ) -> None:
        self.stage = stage
        self._args = (world_size, extra, root, limit)
        self.error: BaseException | None = None
        # not a daemon: an interpreter that exits without end_training still finishes the save
        self._thread = threading.Thread(target=self._run, name="ckpt-async-save")
        self._thread.start()

    @property
    def target(self) -> Path:
        return self.stage.target

    def _run(self) -> None:
        world_size, extra, root, limit = self._args
        stage, group = self.stage, self.stage.group
        error: BaseException | None = None
        try:
            stage.flush()
        except BaseException as err:  # noqa: BLE001 - every rank must learn of it before publishing
            error = err
        try:
            if atomic.any_rank(error is not None, group):
                stage.abort()
                self.error = error or CheckpointError("another rank failed while writing its files")
                return
            stage.publish(world_size, extra)
            if root is not None and stage.is_writer:
                naming.enforce_total_limit(root, limit)
            atomic.barrier(group)
        except BaseException as err:  # noqa: BLE001 - kept for the next call on the training thread
            self.error = err

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self) -> None:
        self._thread.join()
        if self.error is not None:
            raise CheckpointError(
                f"the asynchronous save of {str(self.target)!r} failed: "
                f"{type(self.error).__name__}: {self.error}; nothing of it was published (earlier "
                "checkpoints are untouched)"
            ) from self.error


_GROUP: list[Any] = [None, None]  # (the default group it was made under, the group)


def checkpoint_group() -> Any:
    """A gloo group over every rank, made once per default group (collective on first use)."""
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return None
    if _GROUP[0] is not dist.group.WORLD:
        _GROUP[:] = [dist.group.WORLD, dist.new_group(backend="gloo")]
    return _GROUP[1]
