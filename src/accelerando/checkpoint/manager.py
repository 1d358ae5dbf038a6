"""`Checkpointer`: what `Accelerator.save_state` / `load_state` do, in two phases each.

Saving: gather state dicts, stage every file beside the target, flush, write the manifest last and
rename into place (see `atomic.py`). Loading: validate the manifest, read and check every file into
memory, and only then apply it to the live objects, so a bad checkpoint changes nothing.
The on-disk layout is documented in docs/checkpointing.md.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.hooks import RemovableHandle

from accelerando.checkpoint import atomic, naming, rng
from accelerando.checkpoint.atomic import CheckpointError
from accelerando.checkpoint.layout import Layout
from accelerando.checkpoint.objects import TrainingObjects
from accelerando.checkpoint.state_io import OptimizerSlot, StateIO
from accelerando.config.options import ProjectConfiguration
from accelerando.utils.constants import SCALER_NAME

if TYPE_CHECKING:
    from accelerando.strategies.base import Strategy

logger = logging.getLogger(__name__)
STATE_NAME = "accelerando_state.json"


class Checkpointer:
    """Checkpoint I/O over a registry of training objects and the strategy that owns their format.

    It reads the objects, never owns them, and never sees the `Accelerator`.
    """

    def __init__(self, objects: TrainingObjects, strategy: Strategy, project: ProjectConfiguration) -> None:
        self.objects = objects
        self.strategy = strategy
        self.project = project
        self.topology = strategy.ctx.topology
        self.precision = strategy.ctx.precision
        self._save_hooks: OrderedDict[int, Callable] = OrderedDict()
        self._load_hooks: OrderedDict[int, Callable] = OrderedDict()
        self._pending: Any = None  # the asynchronous save still writing (async_save.PendingSave)
        self._host_buffers: Any = None  # async_save.HostBuffers, made by the first async save

    # ---- hooks -----------------------------------------------------------------------------
    def register_save_state_pre_hook(self, hook: Callable) -> RemovableHandle:
        """`hook(models, weights, output_dir)` before files are written; popping from `weights`
        skips saving those (the hook wrote its own files into `output_dir`, the staging directory)."""
        handle = RemovableHandle(self._save_hooks)
        self._save_hooks[handle.id] = hook
        return handle

    def register_load_state_pre_hook(self, hook: Callable) -> RemovableHandle:
        """`hook(models, input_dir)` before loading; popping from `models` skips loading them."""
        handle = RemovableHandle(self._load_hooks)
        self._load_hooks[handle.id] = hook
        return handle

    # ---- process roles -----------------------------------------------------------------------
    @property
    def _rank(self) -> int:
        return self.topology.rank

    @property
    def _is_writer(self) -> bool:
        """Writes the shared files: the main process, or each node's local main with save_on_each_node."""
        if self.project.save_on_each_node:
            return self.topology.local_rank == 0
        return self._rank == 0

    def _optimizer_slots(self) -> list[OptimizerSlot]:
        return [OptimizerSlot(opt.optimizer, self.objects.owner_of(opt)) for opt in self.objects.optimizers]

    # ---- save ------------------------------------------------------------------------------
    def _resolve_output_dir(self, output_dir: str | None) -> tuple[Path, Path | None]:
        project = self.project
        if project.automatic_checkpoint_naming:
            if output_dir is not None:
                logger.warning("automatic_checkpoint_naming is on: output_dir=%r is ignored", output_dir)
            root = naming.checkpoints_root(project.project_dir)
            target = root / naming.checkpoint_name(project.iteration)
            if atomic.is_complete(target):
                raise ValueError(
                    f"checkpoint {str(target)!r} already exists; set "
                    "accelerator.project_configuration.iteration to a new value or load_state() first"
                )
            return target, root
        if output_dir is None:
            raise ValueError(
                "save_state needs output_dir, or ProjectConfiguration(project_dir=..., "
                "automatic_checkpoint_naming=True)"
            )
        return Path(output_dir), None

    def save_state(
        self,
        output_dir: str | None = None,
        safe_serialization: bool = True,
        async_save: bool = False,
        **kwargs: Any,
    ) -> str:
        """Write every prepared and registered object's state atomically; returns the folder.

        `async_save=True` returns once the state is copied to host memory (see `async_save.py`).
        """
        if kwargs:
            raise TypeError(
                f"save_state got unsupported arguments {sorted(kwargs)}; accepted: output_dir, "
                "safe_serialization, async_save"
            )
        if not isinstance(async_save, bool):
            raise TypeError(f"save_state(async_save={async_save!r}): accepted values are True and False")
        self.wait()
        target, root = self._resolve_output_dir(output_dir)
        limit = self.project.total_limit
        if limit is not None and (not isinstance(limit, int) or limit < 1):
            raise ValueError(
                f"ProjectConfiguration.total_limit must be an integer >= 1 or None, got {limit!r}"
            )
        gradient = self.objects.gradient
        if gradient is not None and gradient.step_in_window != 0:
            logger.warning(
                "save_state inside an accumulation window: the accumulated gradients are not saved"
            )
        state_io = self.strategy.state_io()
        layout = Layout(safe_serialization=safe_serialization)
        models = list(self.objects.models)
        weights = state_io.weights_for_hooks(models)
        stage = self._stage(target, state_io.name, async_save).open()
        error: BaseException | None = None
        try:
            for hook in list(self._save_hooks.values()):
                hook(models, weights, str(stage.path))
            if async_save:
                weights = self._host_buffers.copy(weights, ("weights",))
            self._write_all(stage, layout, state_io, models, weights)
        except BaseException as err:  # noqa: BLE001 - every rank must learn of the failure first
            error = err
        if self._host_buffers is not None:
            self._host_buffers.snapshot = None  # copies outside a save are never deferred
        if atomic.any_rank(error is not None):
            stage.abort()
            if error is not None:
                raise _explained(error, stage.path, target)
            raise CheckpointError(
                f"another rank failed while saving {str(target)!r}; the previous checkpoint is intact"
            )
        extra = {"layout": layout.describe()}
        if async_save:
            from accelerando.checkpoint.async_save import DeferredStage, PendingSave, tensor_bytes

            assert isinstance(stage, DeferredStage)
            stage.host_bytes += tensor_bytes(weights)
            world = self.topology.world_size
            logger.debug("asynchronous save of %s: %d bytes copied to host memory", target, stage.host_bytes)
            self._pending = PendingSave(stage, world_size=world, extra=extra, root=root, limit=limit)
            if root is not None:
                self.project.iteration += 1
            return str(target)
        stage.publish(self.topology.world_size, extra=extra)
        if root is not None:
            self.project.iteration += 1
            if self._is_writer:
                naming.enforce_total_limit(root, limit)
            atomic.barrier()
        return str(target)

    def _stage(self, target: Path, state_format: str, async_save: bool) -> atomic.StagedCheckpoint:
        if not async_save:
            return atomic.StagedCheckpoint(target, is_writer=self._is_writer)
        from accelerando.checkpoint.async_save import (
            SUPPORTED_FORMATS,
            DeferredStage,
            HostBuffers,
            Snapshot,
            checkpoint_group,
            protected_storages,
        )

        if state_format not in SUPPORTED_FORMATS:
            raise ValueError(
                f"save_state(async_save=True) is not supported with strategy {self.strategy.name!r} "
                f"(its state format {state_format!r} is written by the engine itself); accepted with "
                f"the {' and '.join(SUPPORTED_FORMATS)} state formats (single device, DDP, FSDP2, "
                "tensor parallel). Use save_state(async_save=False)"
            )
        buffers = self._host_buffers = self._host_buffers or HostBuffers()
        optimizers = [slot.optimizer for slot in self._optimizer_slots()]
        buffers.guard(optimizers, self._snapshot_in_progress)  # steps wait for the deferred copies
        snapshot = buffers.snapshot = Snapshot(protected_storages(optimizers))
        group = checkpoint_group()
        return DeferredStage(
            target, is_writer=self._is_writer, group=group, buffers=buffers, snapshot=snapshot
        )

    def _snapshot_in_progress(self) -> Any:
        """The pending asynchronous save's snapshot (an optimizer step waits for its copies)."""
        return self._pending.stage.snapshot if self._pending is not None else None

    def _write_all(
        self,
        stage: atomic.StagedCheckpoint,
        layout: Layout,
        state_io: StateIO,
        models: list[Any],
        weights: list[Any],
    ) -> None:
        writer, objects = self._is_writer, self.objects
        saved_models = state_io.save(
            stage, layout, models, weights, self._optimizer_slots(), writer=writer, rank=self._rank
        )
        if writer:
            for i, sched in enumerate(objects.schedulers):
                stage.write(layout.scheduler(i), sched.state_dict())
            scaler_state = self.precision.state_dict()
            if scaler_state:
                stage.write(SCALER_NAME, scaler_state)
            loader_notes = []
            for i, dl in enumerate(objects.dataloaders):
                state, note = _loader_state(dl)
                loader_notes.append(note)
                stage.write(layout.dataloader(i), state)
            for i, obj in enumerate(objects.custom):
                stage.write(layout.custom(i), obj.state_dict())
            meta = self._counters(layout, loader_notes, saved_models, state_io)
            stage.write(STATE_NAME, lambda p: p.write_text(json.dumps(meta, indent=1)))
        rng_state = rng.capture_rng_state(objects.device_kind)
        stage.write(layout.rng(self._rank), rng_state)

    def _counters(
        self, layout: Layout, loader_notes: list[str], n_models: int, state_io: StateIO
    ) -> dict[str, Any]:
        g = self.objects.gradient
        return {
            "step": int(self.objects.step),
            "log_step": int(self.objects.log_step),
            "gradient": {
                "step_in_window": g.step_in_window if g is not None else 0,
                "window_size": g.window_size if g is not None else 1,
                "sync_gradients": bool(g.sync_gradients) if g is not None else True,
            },
            "iteration": int(self.project.iteration),
            "world_size": int(self.topology.world_size),
            "counts": self.objects.counts(n_models),
            **state_io.describe(),
            "state_format": state_io.name,
            "layout": layout.describe(),
            "dataloaders": loader_notes,
            "mixed_precision": str(self.precision.name),
            "torch_version": torch.__version__,
        }

    # ---- load ------------------------------------------------------------------------------
    def _resolve_input_dir(self, input_dir: str | None) -> Path:
        project = self.project
        if input_dir is not None:
            return Path(input_dir)
        if not project.automatic_checkpoint_naming:
            raise ValueError(
                "load_state needs input_dir, or ProjectConfiguration(automatic_checkpoint_naming=True)"
            )
        root = naming.checkpoints_root(project.project_dir)
        latest = naming.latest_checkpoint(root)
        if latest is None:
            raise CheckpointError(f"no complete checkpoint under {str(root)!r}")
        self._remove_leftovers(root, latest)
        return latest

    def _remove_leftovers(self, root: Path, latest: Path) -> None:
        """Resuming: partial checkpoints left by a killed save are never loaded; say so and delete them."""
        if self._is_writer:
            for partial in naming.leftovers(root):
                logger.warning(
                    "ignoring %s, a checkpoint whose save did not finish (the process was killed while "
                    "writing it); resuming from %s and removing it",
                    partial,
                    latest.name,
                )
                shutil.rmtree(partial, ignore_errors=True)
        atomic.barrier()

    def load_state(
        self,
        input_dir: str | None = None,
        *,
        verify: str = "full",
        load_kwargs: dict[str, Any] | None = None,
        **load_model_func_kwargs: Any,
    ) -> str:
        """Validate, read everything, then apply; a damaged checkpoint leaves the live state unchanged."""
        from accelerando.checkpoint.loading import apply_payload, read_payload

        unknown = set(load_model_func_kwargs) - {"strict"}
        if unknown:
            raise TypeError(
                f"load_state got unsupported arguments {sorted(unknown)}; accepted: input_dir, "
                "verify, load_kwargs, strict"
            )
        if verify not in atomic.VERIFY_MODES:
            raise ValueError(f"load_state(verify={verify!r}): accepted values are {atomic.VERIFY_MODES}")
        strict = bool(load_model_func_kwargs.get("strict", True))
        self.wait()
        directory = self._resolve_input_dir(input_dir)
        models = list(self.objects.models)
        for hook in list(self._load_hooks.values()):
            hook(models, str(directory))
        # Presence and sizes are checked before any read (cheap, and a missing shard must not
        # surface as a reader's FileNotFoundError); checksums run in the background while the
        # files are read; nothing is applied until both finished on every rank.
        early: Exception | None = None
        if verify != "none":
            try:
                atomic.validate_checkpoint(directory, "size")
            except CheckpointError as err:
                early = err
        if atomic.any_rank(early is not None):
            if early is not None:
                raise early
            raise CheckpointError(f"another rank found {str(directory)!r} incomplete; nothing was loaded")
        check = None
        if self.topology.local_rank == 0 and verify == "full":
            pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-verify")
            check = pool.submit(atomic.validate_checkpoint, directory, verify)
            pool.shutdown(wait=False)
        payload, error = None, None
        try:
            payload = read_payload(self, directory, models, strict=strict)
        except Exception as err:  # noqa: BLE001 - all ranks must agree before any of them applies
            error = err
        if check is not None:
            try:
                check.result()
            except CheckpointError as err:
                error = err  # the damage explains any read error: report it first
        if atomic.any_rank(error is not None):
            if error is not None:
                raise error
            raise CheckpointError(
                f"another rank could not validate or read {str(directory)!r}; nothing was loaded"
            )
        assert payload is not None
        apply_payload(self, payload)
        if self.project.automatic_checkpoint_naming:
            self.project.iteration = int(payload.meta.get("iteration", -1)) + 1
        return str(directory)

    # ---- models ------------------------------------------------------------------------------
    def save_model(
        self,
        model: torch.nn.Module,
        save_directory: str,
        max_shard_size: int | str = "10GB",
        safe_serialization: bool = True,
    ) -> None:
        from accelerando.checkpoint import model_io

        model_io.save_model(self.strategy, model, save_directory, max_shard_size, safe_serialization)

    def save(self, obj: Any, f: Any, safe_serialization: bool = False) -> None:
        from accelerando.checkpoint import model_io

        model_io.save(self.strategy, obj, f, safe_serialization=safe_serialization)

    def get_state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict[str, Any]:
        from accelerando.checkpoint import model_io

        return model_io.get_state_dict(self.strategy, model, unwrap=unwrap)

    @property
    def save_in_progress(self) -> bool:
        """An asynchronous save is still writing in the background."""
        return self._pending is not None and not self._pending.done()

    def wait(self) -> None:
        """Wait for a pending asynchronous save; its failure is raised here, naming the checkpoint."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()


def _explained(error: BaseException, staging: Path, target: Path) -> BaseException:
    """A save that ran out of space says so, and what became of the partial and the old checkpoint."""
    from accelerando.checkpoint.diskspace import SPACE_ERRNOS, OutOfSpaceError, space_errno

    code = space_errno(error)
    if code is None:
        return error
    detail = error.strerror if isinstance(error, OutOfSpaceError) else SPACE_ERRNOS[code]
    filename = error.filename if isinstance(error, OSError) and error.filename else str(staging)
    kept = (
        f"the existing {target.name} is unchanged" if target.exists() else "no earlier checkpoint was touched"
    )
    message = f"saving {str(target)!r}: {detail}; the partial save {staging.name} was removed and {kept}"
    explained = OutOfSpaceError(code, message, filename)
    explained.__cause__ = error
    return explained


def _loader_state(dl: Any) -> tuple[dict[str, Any], str]:
    """A loader's position: its own `state_dict()` when it has one, else the sampler epoch at best."""
    if hasattr(dl, "state_dict") and hasattr(dl, "load_state_dict"):
        return {"kind": "state_dict", "state": dl.state_dict()}, "state_dict"
    for holder in (
        dl,
        getattr(dl, "sampler", None),
        getattr(getattr(dl, "batch_sampler", None), "sampler", None),
    ):
        epoch = getattr(holder, "epoch", None)
        if isinstance(epoch, int):
            return {"kind": "epoch", "epoch": epoch}, "epoch only: this loader has no state_dict()"
    return {"kind": "none"}, "not saved: this loader has no state_dict() and no epoch"
