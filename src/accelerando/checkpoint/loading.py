"""`load_state`'s two phases: read and check every file into memory, then apply it all at once.

Phase one raises `CheckpointError` naming the first problems found (counts that differ from the
live objects, missing keys, wrong shapes, unreadable files) before any live object is touched.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from accelerando.checkpoint import rng
from accelerando.checkpoint import state_dict as sd_io
from accelerando.checkpoint.atomic import CheckpointError
from accelerando.checkpoint.layout import Layout
from accelerando.checkpoint.state_io import StateIO, StateRead
from accelerando.utils.constants import SCALER_NAME

if TYPE_CHECKING:
    from accelerando.checkpoint.manager import Checkpointer

logger = logging.getLogger(__name__)


@dataclass
class Payload:
    meta: dict[str, Any]
    state_io: StateIO
    state: StateRead = field(default_factory=StateRead)  # models and optimizers, in the strategy's format
    schedulers: list[dict[str, Any]] = field(default_factory=list)
    scaler: dict[str, Any] | None = None
    dataloaders: list[dict[str, Any]] = field(default_factory=list)
    custom: list[Any] = field(default_factory=list)
    rng_state: dict[str, Any] | None = None


def _read_meta(directory: Path) -> dict[str, Any]:
    from accelerando.checkpoint.manager import STATE_NAME

    path = directory / STATE_NAME
    if not path.is_file():
        raise CheckpointError(
            f"checkpoint {str(directory)!r} has no {STATE_NAME}; it was not written by save_state"
        )
    return dict(json.loads(path.read_text()))


def _check_counts(ckpt: Checkpointer, meta: dict[str, Any], directory: Path, n_models: int) -> None:
    live = ckpt.objects.counts(n_models)
    saved = meta.get("counts", {})
    diff = [f"{k}: checkpoint {saved.get(k)}, live {v}" for k, v in live.items() if saved.get(k) != v]
    if diff:
        raise CheckpointError(
            f"checkpoint {str(directory)!r} does not match what was prepared ({'; '.join(diff)})"
        )


def read_payload(ckpt: Checkpointer, directory: Path, models: list[Any], *, strict: bool = True) -> Payload:
    """Everything the checkpoint holds, read and checked against the live objects; nothing applied."""
    objects = ckpt.objects
    meta = _read_meta(directory)
    _check_counts(ckpt, meta, directory, len(models))
    layout = Layout.from_meta(meta.get("layout", {}))
    state_io = ckpt.strategy.state_io()
    saved_format = meta.get("state_format")  # absent before 0.2: the format's own check decides
    if saved_format not in (None, state_io.name):
        refusal: str | None = (
            f"it holds {saved_format} state, but strategy {ckpt.strategy.name!r} reads {state_io.name} state"
        )
    else:
        refusal = state_io.refusal(meta)
    if refusal is not None:
        raise CheckpointError(f"checkpoint {str(directory)!r} cannot be loaded: {refusal}")
    payload = Payload(meta=meta, state_io=state_io)
    payload.state = state_io.read(directory, layout, models, ckpt._optimizer_slots(), strict=strict)
    problems = list(payload.state.problems)
    payload.schedulers = [
        sd_io.load_data_file(directory / layout.scheduler(i)) for i in range(len(objects.schedulers))
    ]
    if (directory / SCALER_NAME).is_file():
        payload.scaler = sd_io.load_data_file(directory / SCALER_NAME)
    elif ckpt.precision.state_dict():
        problems.append(f"{SCALER_NAME} is missing but this run uses a GradScaler")
    payload.dataloaders = [
        sd_io.load_data_file(directory / layout.dataloader(i)) for i in range(len(objects.dataloaders))
    ]
    payload.custom = [sd_io.load_data_file(directory / layout.custom(i)) for i in range(len(objects.custom))]
    payload.rng_state = _read_rng(ckpt, directory, layout, meta)
    if problems:
        raise CheckpointError(
            f"checkpoint {str(directory)!r} does not fit the live objects: " + "; ".join(problems)
        )
    return payload


def _read_rng(ckpt: Checkpointer, directory: Path, layout: Layout, meta: dict[str, Any]) -> dict[str, Any]:
    """This rank's generators; with more ranks than the save had, rank r reads rank r % saved."""
    rank = ckpt.topology.rank
    saved_world = int(meta.get("world_size", 1))
    source = rank if rank < saved_world else rank % saved_world
    if source != rank:
        logger.warning(
            "checkpoint was saved by %d processes; rank %d restores rank %d's RNG", saved_world, rank, source
        )
    name = layout.rng(source)
    state = sd_io.load_data_file(directory / name)
    rng.validate_rng_state(state, name)
    return dict(state)


def apply_payload(ckpt: Checkpointer, payload: Payload) -> None:
    """Phase two: hand every state to its owner. Only reached once phase one succeeded everywhere."""
    objects = ckpt.objects
    payload.state_io.apply(payload.state)
    for sched, state in zip(objects.schedulers, payload.schedulers):
        sched.load_state_dict(state)
    if payload.scaler:
        ckpt.precision.load_state_dict(payload.scaler)
    for dl, state in zip(objects.dataloaders, payload.dataloaders):
        _restore_loader(dl, state)
    for obj, state in zip(objects.custom, payload.custom):
        obj.load_state_dict(state)
    _restore_counters(ckpt, payload.meta)
    if payload.rng_state is not None:
        rng.restore_rng_state(payload.rng_state, objects.device_kind)


def _restore_loader(dl: Any, state: dict[str, Any]) -> None:
    kind = state.get("kind")
    if kind == "state_dict" and hasattr(dl, "load_state_dict"):
        dl.load_state_dict(state["state"])
    elif kind in ("state_dict", "epoch") and hasattr(dl, "set_epoch") and "epoch" in state:
        dl.set_epoch(int(state["epoch"]))
    elif kind != "none":
        logger.warning(
            "a data loader's saved position (%s) cannot be restored into %s", kind, type(dl).__name__
        )


def _restore_counters(ckpt: Checkpointer, meta: dict[str, Any]) -> None:
    """`accelerator.step` and the accumulation window, so the next sync happens where it would have;
    the tracking step, so the next `log()` continues the curves."""
    ckpt.objects.step = int(meta.get("step", 0))
    ckpt.objects.log_step = int(meta.get("log_step", 0))
    g = ckpt.objects.gradient
    if g is None:
        return
    saved = meta.get("gradient", {})
    g.step_in_window = int(saved.get("step_in_window", 0))
    g.window_size = int(saved.get("window_size", g.num_steps))
    g.sync_gradients = bool(saved.get("sync_gradients", True))
