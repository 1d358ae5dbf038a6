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
from accelerando.utils.constants import SCALER_NAME

if TYPE_CHECKING:
    from accelerando.checkpoint.manager import Checkpointer

logger = logging.getLogger(__name__)


@dataclass
class Payload:
    meta: dict[str, Any]
    models: list[tuple[Any, dict[str, Any]]] = field(default_factory=list)
    optimizers: list[dict[str, Any]] = field(default_factory=list)
    schedulers: list[dict[str, Any]] = field(default_factory=list)
    scaler: dict[str, Any] | None = None
    dataloaders: list[dict[str, Any]] = field(default_factory=list)
    custom: list[Any] = field(default_factory=list)
    rng_state: dict[str, Any] | None = None
    sharded: bool = False


def _read_meta(directory: Path) -> dict[str, Any]:
    from accelerando.checkpoint.manager import STATE_NAME

    path = directory / STATE_NAME
    if not path.is_file():
        raise CheckpointError(
            f"checkpoint {str(directory)!r} has no {STATE_NAME}; it was not written by save_state"
        )
    return dict(json.loads(path.read_text()))


def _check_counts(ckpt: Checkpointer, meta: dict[str, Any], directory: Path, n_models: int) -> None:
    acc = ckpt.acc
    live = {
        "models": n_models,
        "optimizers": len(acc._optimizers),
        "schedulers": len(acc._schedulers),
        "dataloaders": len(acc._dataloaders),
        "custom_objects": len(acc._custom_objects),
    }
    saved = meta.get("counts", {})
    diff = [f"{k}: checkpoint {saved.get(k)}, live {v}" for k, v in live.items() if saved.get(k) != v]
    if diff:
        raise CheckpointError(
            f"checkpoint {str(directory)!r} does not match what was prepared ({'; '.join(diff)})"
        )


def read_payload(ckpt: Checkpointer, directory: Path, models: list[Any], *, strict: bool = True) -> Payload:
    """Everything the checkpoint holds, read and checked against the live objects; nothing applied."""
    acc, strategy = ckpt.acc, ckpt.acc.strategy
    meta = _read_meta(directory)
    _check_counts(ckpt, meta, directory, len(models))
    layout = Layout.from_meta(meta.get("layout", {}))
    payload = Payload(meta=meta, sharded=bool(meta.get("sharded", False)))
    if payload.sharded != bool(strategy.sharded_checkpoint):
        raise CheckpointError(
            f"checkpoint {str(directory)!r} is {'sharded' if payload.sharded else 'full'}, but the current "
            f"strategy {strategy.name!r} expects the other kind"
        )
    problems: list[str] = []
    if payload.sharded:
        _read_sharded(ckpt, directory, layout, models, payload)
    else:
        for i, model in enumerate(models):
            state = sd_io.read_model_file(directory / layout.model(i))
            expected = strategy.model_state_dict(model, full=False)  # names and global shapes, no gather
            problems += sd_io.check_model_state(expected, state, layout.model(i), strict=strict)
            payload.models.append((model, state))
        for i, opt in enumerate(acc._optimizers):
            state = sd_io.load_data_file(directory / layout.optimizer(i))
            problems += sd_io.check_optimizer_state(opt.optimizer, state, layout.optimizer(i))
            payload.optimizers.append(state)
    payload.schedulers = [
        sd_io.load_data_file(directory / layout.scheduler(i)) for i in range(len(acc._schedulers))
    ]
    if (directory / SCALER_NAME).is_file():
        payload.scaler = sd_io.load_data_file(directory / SCALER_NAME)
    elif acc.precision.state_dict():
        problems.append(f"{SCALER_NAME} is missing but this run uses a GradScaler")
    payload.dataloaders = [
        sd_io.load_data_file(directory / layout.dataloader(i)) for i in range(len(acc._dataloaders))
    ]
    payload.custom = [
        sd_io.load_data_file(directory / layout.custom(i)) for i in range(len(acc._custom_objects))
    ]
    payload.rng_state = _read_rng(ckpt, directory, layout, meta)
    if problems:
        raise CheckpointError(
            f"checkpoint {str(directory)!r} does not fit the live objects: " + "; ".join(problems)
        )
    return payload


def _read_rng(ckpt: Checkpointer, directory: Path, layout: Layout, meta: dict[str, Any]) -> dict[str, Any]:
    """This rank's generators; with more ranks than the save had, rank r reads rank r % saved."""
    rank = ckpt.acc.process_index
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


def _read_sharded(
    ckpt: Checkpointer, directory: Path, layout: Layout, models: list[Any], payload: Payload
) -> None:
    """DCP reads into copies of this rank's shards (collective on every rank)."""
    acc, strategy = ckpt.acc, ckpt.acc.strategy
    for i, model in enumerate(models):
        template = {"model": strategy.model_state_dict(model, full=False)}
        payload.models.append(
            (model, sd_io.load_sharded(directory / layout.sharded_model(i), template)["model"])
        )
    for i, opt in enumerate(acc._optimizers):
        template = {"optimizer": strategy.optimizer_state_dict(ckpt._owner(opt), opt.optimizer, full=False)}
        payload.optimizers.append(
            sd_io.load_sharded(directory / layout.sharded_optimizer(i), template)["optimizer"]
        )


def apply_payload(ckpt: Checkpointer, payload: Payload) -> None:
    """Phase two: hand every state to its owner. Only reached once phase one succeeded everywhere."""
    acc, strategy = ckpt.acc, ckpt.acc.strategy
    full = not payload.sharded
    for model, state in payload.models:
        strategy.load_model_state_dict(model, state, full=full)
    for opt, state in zip(acc._optimizers, payload.optimizers):
        strategy.load_optimizer_state_dict(ckpt._owner(opt), opt.optimizer, state, full=full)
    for sched, state in zip(acc._schedulers, payload.schedulers):
        sched.load_state_dict(state)
    if payload.scaler:
        acc.precision.load_state_dict(payload.scaler)
    for dl, state in zip(acc._dataloaders, payload.dataloaders):
        _restore_loader(dl, state)
    for obj, state in zip(acc._custom_objects, payload.custom):
        obj.load_state_dict(state)
    _restore_counters(acc, payload.meta)
    if payload.rng_state is not None:
        rng.restore_rng_state(payload.rng_state, acc._runtime.device_kind)


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


def _restore_counters(acc: Any, meta: dict[str, Any]) -> None:
    """`accelerator.step` and the accumulation window, so the next sync happens where it would have."""
    acc.step = int(meta.get("step", 0))
    g = acc._runtime.gradient
    saved = meta.get("gradient", {})
    g.step_in_window = int(saved.get("step_in_window", 0))
    g.window_size = int(saved.get("window_size", g.num_steps))
    g.sync_gradients = bool(saved.get("sync_gradients", True))
