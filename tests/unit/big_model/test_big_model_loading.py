"""Checkpoint loading: single file, sharded index, .bin, dtype, disk entries served from safetensors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from bigmodel_toys import Toy, inputs, reference
from huggingface_hub import save_torch_state_dict
from safetensors.torch import save_file

from accelerando.big_modeling import init_empty_weights, load_checkpoint_and_dispatch
from accelerando.utils.modeling import load_checkpoint_in_model, load_state_dict
from accelerando.utils.offload import load_offloaded_weight, offload_weight, save_offload_index


def meta_toy(**kwargs: object) -> Toy:
    with init_empty_weights():
        return Toy(**kwargs)  # type: ignore[arg-type]


def save_single(folder: Path, **kwargs: object) -> Toy:
    ref = reference(**kwargs)
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, folder / "model.safetensors")
    return ref


def test_load_single_safetensors_zero_copy_on_cpu(tmp_path: Path) -> None:
    ref = save_single(tmp_path)
    model = meta_toy()
    load_checkpoint_in_model(model, tmp_path / "model.safetensors")
    assert torch.equal(model(inputs()), ref(inputs()))
    assert isinstance(model.embed.weight, torch.nn.Parameter)
    assert model.table.device.type == "cpu"  # non-persistent buffer kept from init


def test_load_sharded_index_and_folder(tmp_path: Path) -> None:
    ref = reference()
    save_torch_state_dict(ref.state_dict(), tmp_path, max_shard_size=2000)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    for target in (tmp_path, tmp_path / "model.safetensors.index.json"):
        model = meta_toy()
        load_checkpoint_in_model(model, target)
        assert torch.equal(model(inputs()), ref(inputs()))


def test_load_bin_with_weights_only_and_dtype(tmp_path: Path) -> None:
    ref = reference()
    torch.save(ref.state_dict(), tmp_path / "pytorch_model.bin")
    assert set(load_state_dict(tmp_path / "pytorch_model.bin")) == set(ref.state_dict())
    model = meta_toy()
    load_checkpoint_in_model(model, tmp_path, dtype=torch.float16, keep_in_fp32_modules=["head"])
    assert model.embed.weight.dtype == torch.float16 and model.head.weight.dtype == torch.float32
    assert torch.equal(model.embed.weight, ref.embed.weight.half())
    torch.save({"x": object()}, tmp_path / "evil.bin")
    with pytest.raises(Exception, match="weights_only|Unsupported"):
        load_state_dict(tmp_path / "evil.bin")


def test_disk_entries_from_safetensors_are_not_copied(tmp_path: Path) -> None:
    ref = save_single(tmp_path / "ckpt", tie=False) if (tmp_path / "ckpt").mkdir() is None else None
    offload = tmp_path / "offload"
    model = meta_toy()
    device_map = {"embed": "cpu", "blocks": "disk", "head": "cpu", "scale": "cpu", "table": "cpu"}
    load_checkpoint_in_model(model, tmp_path / "ckpt", device_map=device_map, offload_folder=offload)
    index = json.loads((offload / "index.json").read_text())
    assert index["blocks.0.up.weight"]["safetensors_file"].endswith("model.safetensors")
    assert sorted(p.name for p in offload.iterdir()) == ["index.json"]
    assert model.blocks[0].up.weight.device.type == "meta"
    assert ref is not None


def test_disk_entries_from_bin_are_written_once(tmp_path: Path) -> None:
    ref = reference()
    torch.save(ref.state_dict(), tmp_path / "pytorch_model.bin")
    model = meta_toy()
    device_map = {"embed": "cpu", "blocks": "disk", "head": "disk", "scale": "cpu", "table": "cpu"}
    with pytest.raises(ValueError, match="offload_folder"):
        load_checkpoint_and_dispatch(meta_toy(), tmp_path, device_map=device_map)
    load_checkpoint_and_dispatch(model, tmp_path, device_map=device_map, offload_folder=tmp_path / "off")
    assert (tmp_path / "off" / "blocks.0.up.weight.dat").exists()
    assert torch.allclose(model(inputs()), ref(inputs()))


def test_offload_state_dict_staging_gives_same_model(tmp_path: Path) -> None:
    ref = reference()
    torch.save(ref.state_dict(), tmp_path / "pytorch_model.bin")
    model = meta_toy()
    load_checkpoint_in_model(model, tmp_path, device_map={"": "cpu"}, offload_state_dict=True)
    assert torch.equal(model(inputs()), ref(inputs()))


def test_strict_and_mismatch(tmp_path: Path) -> None:
    state = reference().state_dict()
    state.pop("head.weight")
    state["extra"] = torch.zeros(1)
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="missing.*head.weight"):
        load_checkpoint_in_model(meta_toy(), tmp_path, strict=True)
    with pytest.raises(ValueError, match="still on 'meta'.*head.weight"):
        load_checkpoint_and_dispatch(meta_toy(), tmp_path, device_map={"": "cpu"})
    with pytest.raises(ValueError, match="does not exist"):
        load_checkpoint_in_model(meta_toy(), tmp_path / "nope.safetensors")
    with pytest.raises(ValueError, match="shape"):
        bad = reference(dim=4).state_dict()
        save_file(bad, tmp_path / "model.safetensors")
        load_checkpoint_in_model(meta_toy(), tmp_path)


def test_offload_weight_roundtrip_bf16_and_atomic_index(tmp_path: Path) -> None:
    weight = torch.randn(3, 5).to(torch.bfloat16)
    index = offload_weight(weight, "w", tmp_path)
    save_offload_index(index, tmp_path)
    save_offload_index({"other": {"dtype": "float32", "shape": [1]}}, tmp_path)
    merged = json.loads((tmp_path / "index.json").read_text())
    assert set(merged) == {"w", "other"} and merged["w"] == {"dtype": "bfloat16", "shape": [3, 5]}
    assert torch.equal(load_offloaded_weight(tmp_path / "w.dat", merged["w"]), weight)
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]
