"""Meta init and the hook framework (add/remove/chain, offload to meta and back, cpu/disk offload)."""

from __future__ import annotations

import pytest
import torch
from bigmodel_toys import Block, Toy, inputs, reference
from torch import nn

from accelerando.big_modeling import (
    cpu_offload,
    cpu_offload_with_hook,
    disk_offload,
    init_empty_weights,
    init_on_device,
)
from accelerando.hooks import (
    AlignDevicesHook,
    ModelHook,
    SequentialHook,
    add_hook_to_module,
    remove_hook_from_module,
    remove_hook_from_submodules,
)
from accelerando.utils.offload import OffloadedWeightsLoader


def test_init_empty_weights_keeps_buffers_real() -> None:
    with init_empty_weights():
        model = Toy()
    assert all(p.device.type == "meta" for p in model.parameters())
    assert model.table.device.type == "cpu" and torch.equal(model.table, torch.arange(8.0))
    assert isinstance(model.embed.weight, nn.Parameter) and model.embed.weight.requires_grad
    with init_empty_weights(include_buffers=True):
        model = Toy()
    assert model.table.device.type == "meta"
    # the patch is undone on exit
    assert nn.Linear(2, 2).weight.device.type == "cpu"


def test_init_include_buffers_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_INIT_INCLUDE_BUFFERS", "true")
    with init_empty_weights():
        assert Toy().scale.device.type == "meta"


def test_init_on_device_cpu_and_bad_device() -> None:
    with init_on_device("cpu"):
        assert nn.Linear(2, 2).weight.device.type == "cpu"
    with pytest.raises(ValueError, match="'disk'"):
        with init_on_device("disk"):
            pass


class Scale(ModelHook):
    def __init__(self, factor: float) -> None:
        self.factor = factor

    def pre_forward(self, module, *args, **kwargs):  # type: ignore[no-untyped-def]
        return (args[0] * self.factor,), kwargs

    def post_forward(self, module, output):  # type: ignore[no-untyped-def]
        return output + 1


def test_add_append_and_remove_hooks() -> None:
    torch.manual_seed(0)
    lin = nn.Linear(3, 3)
    x = torch.randn(2, 3)
    plain = lin(x)
    add_hook_to_module(lin, Scale(2.0))
    assert torch.allclose(lin(x), lin._old_forward(2 * x) + 1)
    assert lin.forward.__name__ == "forward"
    add_hook_to_module(lin, Scale(3.0), append=True)
    assert isinstance(lin._hf_hook, SequentialHook)
    assert torch.allclose(lin(x), lin._old_forward(6 * x) + 2)
    add_hook_to_module(lin, Scale(1.0))  # replaces, does not stack
    assert isinstance(lin._hf_hook, Scale)
    remove_hook_from_module(lin)
    assert "forward" not in lin.__dict__ and not hasattr(lin, "_hf_hook") and not hasattr(lin, "_old_forward")
    assert torch.equal(lin(x), plain)
    with pytest.raises(TypeError, match="ModelHook"):
        add_hook_to_module(lin, object())  # type: ignore[arg-type]


def test_no_grad_hook() -> None:
    class NoGrad(ModelHook):
        no_grad = True

    lin = nn.Linear(2, 2)
    add_hook_to_module(lin, NoGrad())
    assert not lin(torch.randn(1, 2)).requires_grad


def test_align_devices_hook_offloads_to_meta_and_serves_weights() -> None:
    torch.manual_seed(0)
    block = Block(4)
    x = torch.randn(2, 4)
    expected = block(x)
    hook = AlignDevicesHook(execution_device="cpu", offload=True, place_submodules=True)
    add_hook_to_module(block, hook)
    assert all(p.device.type == "meta" for p in block.parameters())
    assert torch.allclose(block(x), expected)
    assert all(p.device.type == "meta" for p in block.parameters())
    # the way transformers drives a hook by hand: pre_forward with no inputs
    block._hf_hook.pre_forward(block)
    assert block.up.weight.device.type == "cpu"
    block._hf_hook.post_forward(block, None)
    remove_hook_from_submodules(block)
    assert block.up.weight.device.type == "cpu" and torch.allclose(block(x), expected)


def test_cpu_offload_matches_reference() -> None:
    ref = reference()
    expected = ref(inputs())
    model = cpu_offload(reference(), execution_device="cpu")
    assert model.blocks[0].up.weight.device.type == "meta"
    assert torch.allclose(model(inputs()), expected)


def test_cpu_offload_with_hook_chain() -> None:
    first, second = reference(seed=1), reference(seed=2)
    expected = second(first(inputs()).argmax(-1))
    first, hook1 = cpu_offload_with_hook(first, execution_device="cpu")
    second, hook2 = cpu_offload_with_hook(second, execution_device="cpu", prev_module_hook=hook1)
    assert torch.allclose(second(first(inputs()).argmax(-1)), expected)
    hook2.offload()
    hook2.remove()
    assert not hasattr(second, "_hf_hook")


def test_disk_offload_serves_memmapped_weights(tmp_path) -> None:  # type: ignore[no-untyped-def]
    expected = reference()(inputs())
    model = disk_offload(reference(), tmp_path, execution_device="cpu")
    assert (tmp_path / "index.json").exists() and (tmp_path / "blocks.0.up.weight.dat").exists()
    assert model.head.weight.device.type == "meta"
    assert torch.allclose(model(inputs()), expected)
    loader = OffloadedWeightsLoader(save_folder=tmp_path)
    assert torch.equal(loader["embed.weight"], reference().embed.weight)
