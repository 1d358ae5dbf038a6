"""The checkpoint seam: a registry of training objects and the strategy, never the Accelerator;
each strategy owns the format of what it owns."""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from accelerando import Accelerator, ProjectConfiguration
from accelerando.checkpoint.atomic import CheckpointError, read_manifest
from accelerando.checkpoint.manager import STATE_NAME, Checkpointer
from accelerando.checkpoint.objects import TrainingObjects
from accelerando.checkpoint.state_io import StateIO, StateRead
from accelerando.optimizer import AcceleratedOptimizer
from accelerando.strategies.single_device import SingleDeviceStrategy
from accelerando.strategies.state_io import DCPStateIO, FullStateIO

CHECKPOINT_SRC = Path(__file__).parents[3] / "src" / "accelerando" / "checkpoint"


class EngineStateIO(StateIO):
    """A format the checkpointer has never heard of: one file holding every model and optimizer."""

    name = "engine"

    def describe(self) -> dict[str, Any]:
        return {"engine_format": 1}

    def refusal(self, meta: dict[str, Any]) -> str | None:
        return None if meta.get("engine_format") == 1 else "not an engine checkpoint"

    def save(self, stage, layout, models, weights, optimizers, *, writer, rank) -> int:  # noqa: ANN001
        state = {
            "models": [m.state_dict() for m in models],
            "optim": [s.optimizer.state_dict() for s in optimizers],
        }
        if writer:
            stage.write("engine_state.pt", state)
        return len(models)

    def read(self, directory, layout, models, optimizers, *, strict=True) -> StateRead:  # noqa: ANN001
        state = torch.load(directory / "engine_state.pt", weights_only=True)
        return StateRead(
            models=list(zip(models, state["models"])), optimizers=list(zip(optimizers, state["optim"]))
        )

    def apply(self, state: StateRead) -> None:
        for model, sd in state.models:
            model.load_state_dict(sd)
        for slot, sd in state.optimizers:
            slot.optimizer.load_state_dict(sd)


class EngineStrategy(SingleDeviceStrategy):
    name = "engine"

    def state_io(self) -> StateIO:
        return EngineStateIO()


class ShardedStrategy(SingleDeviceStrategy):
    def state_io(self) -> StateIO:
        return DCPStateIO(self)


def _objects(acc: Accelerator) -> tuple[TrainingObjects, torch.nn.Module]:
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    objects = TrainingObjects(
        models=[model], optimizers=[AcceleratedOptimizer(opt)], gradient=acc._runtime.gradient
    )
    return objects, model


def test_a_strategy_adds_its_own_format_without_the_checkpointer_knowing(tmp_path: Path) -> None:
    acc = Accelerator(cpu=True)
    strategy = EngineStrategy(acc.strategy.ctx)
    objects, model = _objects(acc)
    objects.step = 3
    ckpt = Checkpointer(objects, strategy, ProjectConfiguration())
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    exp_avg = objects.optimizers[0].optimizer.state_dict()["state"][0]["exp_avg"].clone()
    ckpt.save_state(str(tmp_path / "c"))
    assert "engine_state.pt" in read_manifest(tmp_path / "c").files
    meta = json.loads((tmp_path / "c" / STATE_NAME).read_text())
    assert meta["engine_format"] == 1 and meta["counts"]["models"] == 1 and meta["step"] == 3
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    objects.optimizers[0].optimizer.state.clear()
    objects.step = 0
    ckpt.load_state(str(tmp_path / "c"))
    assert all(torch.equal(v, saved[k]) for k, v in model.state_dict().items())
    assert torch.equal(objects.optimizers[0].optimizer.state_dict()["state"][0]["exp_avg"], exp_avg)
    assert objects.step == 3
    # The full format refuses the engine's checkpoint before reading anything.
    plain = Checkpointer(objects, SingleDeviceStrategy(acc.strategy.ctx), ProjectConfiguration())
    with pytest.raises(CheckpointError, match=r"holds engine state, but strategy .single_device. reads full"):
        plain.load_state(str(tmp_path / "c"))


def test_full_and_sharded_formats_refuse_each_other_by_name(tmp_path: Path) -> None:
    acc = Accelerator(cpu=True)
    objects, _ = _objects(acc)
    Checkpointer(objects, acc.strategy, ProjectConfiguration()).save_state(str(tmp_path / "full"))
    sharded = Checkpointer(objects, ShardedStrategy(acc.strategy.ctx), ProjectConfiguration())
    with pytest.raises(
        CheckpointError, match=r"holds full state, but strategy 'single_device' reads sharded"
    ):
        sharded.load_state(str(tmp_path / "full"))
    assert isinstance(acc.strategy.state_io(), FullStateIO)
    # Checkpoints written before `state_format` existed are told apart by their `sharded` flag.
    assert DCPStateIO(acc.strategy).refusal({"sharded": True}) is None
    assert FullStateIO(acc.strategy).refusal({"sharded": False}) is None
    assert "sharded (DCP)" in (FullStateIO(acc.strategy).refusal({"sharded": True}) or "")


def test_the_checkpointer_never_sees_the_accelerator() -> None:
    assert list(inspect.signature(Checkpointer).parameters) == ["objects", "strategy", "project"]
    for path in CHECKPOINT_SRC.glob("*.py"):
        source = path.read_text()
        assert "sharded_checkpoint" not in source, path.name
        assert not re.search(r"\bif\b[^\n]*\bsharded\b", source), path.name
        assert not re.search(r"\bacc(elerator)?\._", source), path.name
