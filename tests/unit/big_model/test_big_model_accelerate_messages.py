"""Warnings and checkpoint-file rules shared with Accelerate, checked against Accelerate itself."""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path

import accelerate.utils.modeling as theirs
import pytest
import torch
from bigmodel_toys import Toy, reference
from safetensors.torch import save_file
from torch import nn

import accelerando.utils.modeling as ours


def test_device_map_keys_naming_nothing_warn_like_accelerate() -> None:
    model = Toy()
    device_map = {"": "cpu", "bogus.layer": 0}
    with pytest.warns(UserWarning) as mine:
        ours.check_device_map(model, device_map)
    with pytest.warns(UserWarning) as expected:
        theirs.check_device_map(model, device_map)
    assert str(mine[0].message).startswith(str(expected[0].message))
    # a key naming a tensor is valid (planners emit the model's own buffers by name): Accelerate warns
    # about its own planner's keys, accelerando does not (docs/migration.md)
    planned = {"embed": "cpu", "blocks": "cpu", "head": "cpu", "scale": "cpu", "table": "cpu"}
    with pytest.warns(UserWarning, match="'scale', 'table'"):
        theirs.check_device_map(model, planned)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ours.check_device_map(model, planned)


@pytest.mark.filterwarnings("ignore:The following device_map keys")  # Accelerate on the tensor keys
def test_uncovered_tensors_raise_with_accelerates_sentence() -> None:
    device_map = {"embed": "cpu", "blocks": "cpu", "scale": "cpu", "table": "cpu"}
    with pytest.raises(ValueError) as expected:
        theirs.check_device_map(Toy(), device_map)
    with pytest.raises(ValueError) as mine:
        ours.check_device_map(Toy(), device_map)
    assert str(mine.value).startswith(str(expected.value))


def _records(caplog: pytest.LogCaptureFixture, prefix: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith(prefix)]


def test_unexpected_checkpoint_keys_warn_like_accelerate(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state = {k: v.clone() for k, v in reference(tie=True).state_dict().items()}  # both tied names saved
    state["extra.weight"] = torch.zeros(3)
    torch.save(state, tmp_path / "pytorch_model.bin")
    prefix = "Some weights of the model checkpoint"
    for device_map in (None, {"": "cpu"}):
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            theirs.load_checkpoint_in_model(
                Toy(tie=True), str(tmp_path / "pytorch_model.bin"), device_map=device_map
            )
            (expected,) = _records(caplog, prefix)
            caplog.clear()
            model = Toy(tie=True)
            ours.load_checkpoint_in_model(model, tmp_path / "pytorch_model.bin", device_map=device_map)
            (mine,) = _records(caplog, prefix)
        assert mine.startswith(expected)  # the tied name head.weight is not reported: it is the model's
        assert model.head.weight is model.embed.weight
        assert torch.equal(model.embed.weight, state["embed.weight"])


def test_offloaded_buffers_without_room_warn_like_accelerate() -> None:
    class Buffered(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(16, 16)
            self.register_buffer("cache", torch.zeros(100))

    model = nn.Sequential(*(Buffered() for _ in range(4)))
    kwargs = {"max_memory": {0: 3000, "cpu": 10**6}, "no_split_module_classes": ["Buffered"]}
    with pytest.warns(UserWarning) as expected:
        theirs.infer_auto_device_map(model, **kwargs)
    with pytest.warns(UserWarning) as mine:
        ours.infer_auto_device_map(model, **kwargs)
    assert str(mine[0].message).startswith(str(expected[0].message))


def test_tied_parameters_on_different_devices_warn_like_accelerate(caplog: pytest.LogCaptureFixture) -> None:
    tied = [["embed.weight", "head.weight"]]
    device_map = {"embed": 0, "blocks": 0, "head": "cpu"}
    with caplog.at_level(logging.WARNING):
        theirs.check_tied_parameters_on_same_device(tied, device_map)
        (expected,) = _records(caplog, "Tied parameters")
        caplog.clear()
        ours.check_tied_parameters_on_same_device(tied, device_map)
        (mine,) = _records(caplog, "Tied parameters")
    assert mine.startswith(expected)


# ---- which files a checkpoint path means: the same tensors are loaded as by Accelerate ----


def _shard(folder: Path, index_name: str, with_weight_map: bool, state: dict[str, torch.Tensor]) -> None:
    names = sorted(state)
    half = len(names) // 2
    parts = {"part-a.safetensors": names[:half], "part-b.safetensors": names[half:]}
    for file, keys in parts.items():
        save_file({k: state[k].contiguous() for k in keys}, folder / file)
    weight_map = {k: file for file, keys in parts.items() for k in keys}
    (folder / index_name).write_text(
        json.dumps({"weight_map": weight_map} if with_weight_map else weight_map)
    )


def _layouts(root: Path) -> dict[str, Path]:
    """Checkpoint paths, each a layout both libraries must read the same way."""
    base = reference(seed=1).state_dict()
    other = reference(seed=2).state_dict()
    paths = {}
    for name, index_name, with_map in [
        ("custom_index", "weights.index.json", True),
        ("bare_map", "shards.index.json", False),
    ]:
        folder = root / name
        folder.mkdir()
        _shard(folder, index_name, with_map, base)
        paths[f"{name}_folder"] = folder
        paths[f"{name}_file"] = folder / index_name
    both = root / "bin_and_safetensors"  # Accelerate takes pytorch_model.bin first
    both.mkdir()
    torch.save(base, both / "pytorch_model.bin")
    save_file({k: v.contiguous() for k, v in other.items()}, both / "model.safetensors")
    paths["bin_and_safetensors"] = both
    single_and_index = root / "single_and_index"  # a whole-model file wins over an index
    single_and_index.mkdir()
    _shard(single_and_index, "model.safetensors.index.json", True, other)
    save_file({k: v.contiguous() for k, v in base.items()}, single_and_index / "model.safetensors")
    paths["single_and_index"] = single_and_index
    return paths


def test_checkpoint_paths_resolve_like_accelerate(tmp_path: Path) -> None:
    for name, path in _layouts(tmp_path).items():
        expected, mine = Toy(), Toy()
        theirs.load_checkpoint_in_model(expected, str(path))
        ours.load_checkpoint_in_model(mine, path)
        for key, value in expected.state_dict().items():
            assert torch.equal(mine.state_dict()[key], value), (name, key)


def test_two_index_files_are_refused_like_accelerate(tmp_path: Path) -> None:
    state = reference().state_dict()
    _shard(tmp_path, "a.index.json", True, state)
    (tmp_path / "b.index.json").write_text((tmp_path / "a.index.json").read_text())
    with pytest.raises(ValueError) as expected:
        theirs.load_checkpoint_in_model(Toy(), str(tmp_path))
    with pytest.raises(ValueError) as mine:
        ours.load_checkpoint_in_model(Toy(), tmp_path)
    assert str(mine.value).startswith(str(expected.value))
