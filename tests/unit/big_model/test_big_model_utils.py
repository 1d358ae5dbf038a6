"""Smaller public helpers: weights views, attach helpers, align_module_device, buffer offload."""

from __future__ import annotations

from pathlib import Path

import torch
from bigmodel_toys import Block, Toy, inputs, reference
from safetensors.torch import save_file

from accelerando.big_modeling import init_empty_weights, load_checkpoint_and_dispatch
from accelerando.hooks import (
    AlignDevicesHook,
    attach_align_device_hook_on_blocks,
    attach_execution_device_hook,
    remove_hook_from_submodules,
)
from accelerando.utils.modeling import align_module_device, load_state_dict, set_module_tensor_to_device
from accelerando.utils.offload import OffloadedWeightsLoader, PrefixedDataset, extract_submodules_state_dict


def test_prefixed_dataset_and_extract() -> None:
    state = {"a.x": torch.zeros(1), "a.y": torch.ones(1), "b.x": torch.zeros(2)}
    view = PrefixedDataset(state, "a.")
    assert sorted(view) == ["x", "y"] and len(view) == 2 and torch.equal(view["y"], torch.ones(1))
    assert set(extract_submodules_state_dict(state, ["a"])) == {"a.x", "a.y"}


def test_loader_mixes_memory_and_files_and_casts(tmp_path: Path) -> None:
    save_file({"w": torch.arange(4.0)}, tmp_path / "m.safetensors")
    index = {
        "w": {"safetensors_file": str(tmp_path / "m.safetensors"), "weight_name": "w", "dtype": "float16"}
    }
    loader = OffloadedWeightsLoader(state_dict={"v": torch.ones(2)}, index=index)
    assert sorted(loader) == ["v", "w"] and loader["w"].dtype == torch.float16
    assert torch.equal(loader["w"], torch.arange(4.0).half())
    assert load_state_dict(tmp_path / "m.safetensors", device_map={"": "disk"}) == {}


def test_set_module_tensor_to_device_keeps_kind_and_dtype() -> None:
    lin = torch.nn.Linear(2, 2).half()
    set_module_tensor_to_device(lin, "weight", "cpu", value=torch.ones(2, 2))
    assert isinstance(lin.weight, torch.nn.Parameter) and lin.weight.dtype == torch.float16
    set_module_tensor_to_device(lin, "bias", "cpu", value=torch.ones(2), dtype=torch.float32)
    assert lin.bias.dtype == torch.float32


def test_attach_helpers_and_align_module_device() -> None:
    torch.manual_seed(0)
    block = Block(4)
    x = torch.randn(2, 4)
    expected = block(x)
    attach_execution_device_hook(block, "cpu")
    assert isinstance(block.up._hf_hook, AlignDevicesHook)
    remove_hook_from_submodules(block)
    state = {k: v.clone() for k, v in block.state_dict().items()}
    attach_align_device_hook_on_blocks(block, execution_device="cpu", offload=True, weights_map=state)
    assert block.up.weight.device.type == "meta"
    assert torch.allclose(block(x), expected)
    with align_module_device(block.up):
        assert block.up.weight.device.type == "cpu"
    assert block.up.weight.device.type == "meta"


def test_offload_buffers_serves_a_disk_buffer(tmp_path: Path) -> None:
    ref = reference()
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, tmp_path / "model.safetensors")
    with init_empty_weights():
        model = Toy()
    device_map = {"embed": "cpu", "blocks": "cpu", "head": "cpu", "scale": "disk", "table": "cpu"}
    model = load_checkpoint_and_dispatch(model, tmp_path, device_map=device_map, offload_buffers=True)
    assert model.scale.device.type == "meta"
    assert torch.allclose(model(inputs()), ref(inputs()))


def test_has_offloaded_params_and_config_ties() -> None:
    from accelerando.big_modeling import cpu_offload
    from accelerando.utils.modeling import check_tied_parameters_in_config, has_offloaded_params

    model = cpu_offload(reference(), execution_device="cpu")
    assert has_offloaded_params(model.blocks[0].up) and not has_offloaded_params(model)
    assert not check_tied_parameters_in_config(reference())
