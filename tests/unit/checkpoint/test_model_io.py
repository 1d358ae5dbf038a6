"""save_model / save / get_state_dict: sharding, shared tensors once, stale shards, atomic files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from ckpt_helpers import Net
from safetensors.torch import load_file

from accelerando import Accelerator
from accelerando.checkpoint.state_dict import read_model_file


def _load_dir(directory: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for shard in sorted(directory.glob("model*.safetensors")):
        out.update(read_model_file(shard))  # restores the names of shared tensors
    return out


def test_sharded_save_model_round_trip(tmp_path: Path) -> None:
    acc = Accelerator(cpu=True)
    model = acc.prepare(torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)]))
    acc.save_model(model, str(tmp_path), max_shard_size="20KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) == 4
    got = _load_dir(tmp_path)
    assert all(torch.equal(got[k], v) for k, v in model.state_dict().items())
    acc.save_model(model, str(tmp_path), max_shard_size="10GB")  # fewer shards: stale ones go
    assert sorted(os.listdir(tmp_path)) == ["model.safetensors"]
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())


def test_shared_tensors_saved_once_and_restored(tmp_path: Path) -> None:
    acc = Accelerator(cpu=True)
    model = acc.prepare(Net(tied=True))
    acc.save_model(model, str(tmp_path))
    raw = load_file(str(tmp_path / "model.safetensors"))
    assert "head.weight" not in raw and "out.weight" in raw
    fresh = Net(tied=True)
    fresh.load_state_dict(_load_dir(tmp_path))
    assert fresh.head.weight is fresh.out.weight
    assert torch.equal(fresh.out.weight, model.out.weight)


def test_unsafe_serialization_and_get_state_dict(tmp_path: Path) -> None:
    acc = Accelerator(cpu=True)
    model = acc.prepare(Net())
    acc.save_model(model, str(tmp_path), safe_serialization=False)
    saved = torch.load(tmp_path / "pytorch_model.bin", weights_only=True)
    state = acc.get_state_dict(model)
    assert set(saved) == set(state) and all(torch.equal(saved[k], v) for k, v in state.items())
    with pytest.raises(ValueError, match="is a file"):
        acc.save_model(model, str(tmp_path / "pytorch_model.bin"))


def test_save_is_atomic_file(tmp_path: Path) -> None:
    acc = Accelerator(cpu=True)
    target = tmp_path / "obj.pt"
    acc.save({"a": torch.ones(3), "n": 1}, str(target))
    assert torch.load(target, weights_only=True)["n"] == 1
    acc.save({"w": torch.zeros(2)}, str(tmp_path / "w.safetensors"), safe_serialization=True)
    assert torch.equal(load_file(str(tmp_path / "w.safetensors"))["w"], torch.zeros(2))
    with pytest.raises(TypeError, match="dict of tensors"):
        acc.save({"n": 1}, str(tmp_path / "bad.safetensors"), safe_serialization=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["obj.pt", "w.safetensors"]
