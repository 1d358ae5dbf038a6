"""Damaged, incomplete or mismatched checkpoints are refused and the live objects stay as they were."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
from ckpt_helpers import Setup

from accelerando.checkpoint.atomic import CheckpointError, validate_checkpoint


def _saved(tmp_path: Path, s: Setup) -> Path:
    s.step()
    return Path(s.acc.save_state(str(tmp_path / "ck")))


def _unchanged(s: Setup, before: list[torch.Tensor], counter: int) -> None:
    assert all(torch.equal(a, b) for a, b in zip(before, s.model.parameters()))
    assert s.counter.value == counter


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda d: (d / "optimizer.bin").unlink(), "missing file 'optimizer.bin'"),
        (lambda d: os.truncate(d / "model.safetensors", 10), "'model.safetensors' has 10 bytes"),
        (lambda d: (d / "manifest.json").unlink(), "incomplete"),
        (lambda d: shutil.rmtree(d), "does not exist"),
    ],
)
def test_damaged_checkpoint_refused(tmp_path: Path, setup: Setup, damage, message: str) -> None:
    ckpt = _saved(tmp_path, setup)
    setup.step()
    before, counter = setup.params(), setup.counter.value
    damage(ckpt)
    with pytest.raises(CheckpointError, match=message):
        setup.acc.load_state(str(ckpt))
    _unchanged(setup, before, counter)


def test_bit_flip_detected(tmp_path: Path, setup: Setup) -> None:
    ckpt = _saved(tmp_path, setup)
    data = bytearray((ckpt / "model.safetensors").read_bytes())
    data[-3] ^= 0x40
    (ckpt / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="'model.safetensors' is corrupt"):
        validate_checkpoint(ckpt)
    validate_checkpoint(ckpt, verify="size")  # a cheaper check does not read the bytes


def test_mismatched_model_refused_before_any_change(tmp_path: Path, setup: Setup) -> None:
    ckpt = _saved(tmp_path, setup)
    other = Setup()
    other.model.out = torch.nn.Linear(8, 5)  # same keys, different shape
    before, counter = other.params(), other.counter.value
    with pytest.raises(CheckpointError, match=r"shape \(4, 8\)"):
        other.acc.load_state(str(ckpt))
    _unchanged(other, before, counter)


def test_count_mismatch_refused(tmp_path: Path, setup: Setup) -> None:
    ckpt = _saved(tmp_path, setup)
    other = Setup()
    other.acc.register_for_checkpointing(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0))
    with pytest.raises(CheckpointError, match="custom_objects: checkpoint 1, live 2"):
        other.acc.load_state(str(ckpt))


def test_unsafe_pickle_refused(tmp_path: Path, setup: Setup) -> None:
    class Evil:
        def state_dict(self):
            return {"obj": Path("/etc")}  # an arbitrary class: not loadable weights-only

        def load_state_dict(self, state):
            raise AssertionError("must not run")

    setup.acc.register_for_checkpointing(Evil())
    ckpt = _saved(tmp_path, setup)
    before, counter = setup.params(), setup.counter.value
    with pytest.raises(CheckpointError, match="custom_checkpoint_1.pkl cannot be loaded weights-only"):
        setup.acc.load_state(str(ckpt))
    _unchanged(setup, before, counter)


def test_failing_save_keeps_previous_checkpoint(tmp_path: Path, setup: Setup) -> None:
    ckpt = _saved(tmp_path, setup)
    good = setup.params()

    class Broken:
        def state_dict(self):
            raise RuntimeError("disk on fire")

        def load_state_dict(self, state):
            pass

    setup.acc.register_for_checkpointing(Broken())
    setup.step()
    with pytest.raises(RuntimeError, match="disk on fire"):
        setup.acc.save_state(str(ckpt))
    assert not (tmp_path / ".ck.incomplete").exists()  # a failed save removes its staging folder
    setup.acc._custom_objects.pop()
    setup.acc.load_state(str(ckpt))
    assert all(torch.equal(a, b) for a, b in zip(good, setup.model.parameters()))
