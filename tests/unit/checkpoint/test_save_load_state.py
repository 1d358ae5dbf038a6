"""save_state / load_state in one process: exact round trip, layout, naming, retention, hooks."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from ckpt_helpers import Setup

from accelerando import ProjectConfiguration


def _continue_equals(s: Setup, ckpt: str, steps: int = 2) -> None:
    """Train from the checkpoint twice: the second continuation must equal the first exactly."""
    s.acc.load_state(ckpt)
    s.step(steps)
    first, counter, lr = s.params(), s.counter.value, s.sched.get_last_lr()
    s.acc.load_state(ckpt)
    s.step(steps)
    assert all(torch.equal(a, b) for a, b in zip(first, s.model.parameters()))
    assert s.counter.value == counter and s.sched.get_last_lr() == lr


@pytest.mark.parametrize("safe", [True, False])
def test_round_trip_is_exact(tmp_path: Path, setup: Setup, safe: bool) -> None:
    setup.step(2)
    out = setup.acc.save_state(str(tmp_path / "ck"), safe_serialization=safe)
    names = set(os.listdir(out))
    model_file = "model.safetensors" if safe else "pytorch_model.bin"
    expected = {
        model_file,
        "optimizer.bin",
        "scheduler.bin",
        "random_states_0.pkl",
        "custom_checkpoint_0.pkl",
    }
    assert expected | {"manifest.json", "accelerando_state.json"} == names
    setup.step(3)  # move everything (weights, Adam moments, LR, RNG, counter) away from the checkpoint
    after = setup.params()
    setup.acc.load_state(out)
    assert setup.counter.value == 2
    setup.step(3)
    assert all(torch.equal(a, b) for a, b in zip(after, setup.model.parameters()))
    _continue_equals(setup, out)


def test_step_counters_restored(tmp_path: Path, setup: Setup) -> None:
    setup.acc.step = 7
    setup.acc._runtime.gradient.step_in_window = 0
    out = setup.acc.save_state(str(tmp_path / "ck"))
    setup.acc.step = 1
    setup.acc.load_state(out)
    assert setup.acc.step == 7
    meta = json.loads((Path(out) / "accelerando_state.json").read_text())
    assert meta["counts"]["models"] == 1 and meta["world_size"] == 1


def test_automatic_naming_and_total_limit(tmp_path: Path) -> None:
    cfg = ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True, total_limit=2)
    s = Setup(cfg)
    saved = []
    for _ in range(3):
        s.step()
        saved.append(s.acc.save_state())
    root = tmp_path / "checkpoints"
    assert sorted(os.listdir(root)) == ["checkpoint_1", "checkpoint_2"]
    assert saved[-1] == str(root / "checkpoint_2")
    (root / "checkpoint_9").mkdir()  # incomplete (no manifest): never picked, never counted
    weights = s.params()
    s.step(2)
    assert s.acc.load_state() == str(root / "checkpoint_2")
    assert all(torch.equal(a, b) for a, b in zip(weights, s.model.parameters()))
    assert s.acc.project_configuration.iteration == 3  # the next save does not collide
    assert s.acc.save_state() == str(root / "checkpoint_3")
    assert sorted(os.listdir(root)) == ["checkpoint_2", "checkpoint_3", "checkpoint_9"]


def test_bad_arguments(tmp_path: Path, setup: Setup) -> None:
    with pytest.raises(ValueError, match="output_dir"):
        setup.acc.save_state()
    with pytest.raises(ValueError, match="input_dir"):
        setup.acc.load_state()
    with pytest.raises(TypeError, match="unsupported"):
        setup.acc.save_state(str(tmp_path / "x"), bogus=1)
    with pytest.raises(ValueError, match="verify"):
        setup.acc.load_state(setup.acc.save_state(str(tmp_path / "y")), verify="sometimes")
    cfg = ProjectConfiguration(automatic_checkpoint_naming=True)
    with pytest.raises(ValueError, match="project"):
        Setup(cfg).acc.save_state()


def test_hooks(tmp_path: Path, setup: Setup) -> None:
    calls = []

    def save_hook(models, weights, output_dir):
        calls.append(("save", len(models), output_dir))
        Path(output_dir, "extra.txt").write_text("mine")

    def load_hook(models, input_dir):
        calls.append(("load", len(models), input_dir))

    h1 = setup.acc.register_save_state_pre_hook(save_hook)
    h2 = setup.acc.register_load_state_pre_hook(load_hook)
    out = setup.acc.save_state(str(tmp_path / "ck"))
    setup.acc.load_state(out)
    assert calls[0][0] == "save" and calls[0][1] == 1 and calls[1] == ("load", 1, out)
    manifest = json.loads((Path(out) / "manifest.json").read_text())
    assert "extra.txt" in manifest["files"]  # a hook's own files are covered by the manifest
    h1.remove()
    h2.remove()
    setup.acc.save_state(str(tmp_path / "ck2"))
    assert len(calls) == 2


def test_save_hook_can_take_over_weights(tmp_path: Path, setup: Setup) -> None:
    setup.acc.register_save_state_pre_hook(lambda models, weights, d: weights.clear())
    setup.acc.register_load_state_pre_hook(lambda models, d: models.clear())
    out = setup.acc.save_state(str(tmp_path / "ck"))
    assert not (Path(out) / "model.safetensors").exists()
    setup.acc.load_state(out)


def test_tied_weights_round_trip(tmp_path: Path) -> None:
    s = Setup(tied=True)
    s.step()
    out = s.acc.save_state(str(tmp_path / "ck"))
    s.step(2)
    s.acc.load_state(out)
    assert s.model.head.weight is s.model.out.weight
    _continue_equals(s, out)
