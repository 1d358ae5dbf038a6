"""dispatch_model / load_checkpoint_and_dispatch: outputs equal the plain model, cpu and disk."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from bigmodel_toys import Toy, inputs, reference
from safetensors.torch import save_file

import accelerando.big_model.offload as offload_module
from accelerando.big_modeling import dispatch_model, init_empty_weights, load_checkpoint_and_dispatch
from accelerando.hooks import AlignDevicesHook


def meta_toy(**kwargs: object) -> Toy:
    with init_empty_weights():
        return Toy(**kwargs)  # type: ignore[arg-type]


def checkpoint(folder: Path, **kwargs: object) -> Toy:
    ref = reference(**kwargs)
    state = {k: v for k, v in ref.state_dict().items() if k != "head.weight" or not kwargs.get("tie")}
    save_file({k: v.contiguous() for k, v in state.items()}, folder / "model.safetensors")
    return ref


def test_single_device_has_no_hooks_and_compiles(tmp_path: Path) -> None:
    ref = checkpoint(tmp_path)
    model = load_checkpoint_and_dispatch(meta_toy(), tmp_path, device_map="auto")
    assert model.hf_device_map == {"": "cpu"}
    assert not any(hasattr(m, "_hf_hook") for m in model.modules())
    compiled = torch.compile(model, backend="aot_eager")
    assert torch.allclose(compiled(inputs()), ref(inputs()))


@pytest.mark.parametrize("strategy", ["auto", "sequential", "balanced", "balanced_low_0"])
def test_cpu_and_disk_map_gives_reference_output(tmp_path: Path, strategy: str) -> None:
    ref = checkpoint(tmp_path)
    model = load_checkpoint_and_dispatch(
        meta_toy(), tmp_path, device_map=strategy, max_memory={"cpu": 3000}, no_split_module_classes=["Block"]
    )
    values = set(model.hf_device_map.values())
    assert values == {"cpu", "disk"}
    assert model.blocks[3].up.weight.device.type == "meta"
    with torch.no_grad():
        assert torch.allclose(model(inputs()), ref(inputs()))
        assert torch.allclose(model(inputs()), ref(inputs()))  # weights go back to meta and come again
    assert model.blocks[3].up.weight.device.type == "meta"
    hook = model.blocks[3]._hf_hook
    assert isinstance(hook, AlignDevicesHook) and hook.offload
    # transformers reads offloaded weights through the hook's weights_map with module-relative names
    assert torch.equal(hook.weights_map["up.weight"], ref.blocks[3].up.weight)


def test_tied_head_on_disk(tmp_path: Path) -> None:
    ref = checkpoint(tmp_path, tie=True)
    model = meta_toy(tie=True)
    device_map = {"embed": "disk", "blocks": "cpu", "head": "disk", "scale": "cpu", "table": "cpu"}
    model = load_checkpoint_and_dispatch(model, tmp_path, device_map=device_map)
    assert torch.allclose(model(inputs()), ref(inputs()))


def test_prefetch_asks_for_the_next_offloaded_block(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    checkpoint(tmp_path)
    model = load_checkpoint_and_dispatch(
        meta_toy(),
        tmp_path,
        device_map={"embed": "cpu", "blocks": "disk", "head": "cpu", "scale": "cpu", "table": "cpu"},
    )
    hooks = [model.blocks[i]._hf_hook for i in range(4)]
    assert [h.next_hook for h in hooks] == hooks[1:] + hooks[:1]
    advised: list[tuple[int, int]] = []
    monkeypatch.setattr(
        offload_module, "_advise", lambda file, offset, length: advised.append((offset, length))
    )
    model(inputs())
    spans = offload_module._SPANS[str((tmp_path / "model.safetensors").resolve())]

    def covered(name: str) -> bool:
        start, length = spans[name]
        return any(low <= start and start + length <= low + size for low, size in advised)

    assert covered("blocks.1.up.weight") and covered("blocks.0.down.bias")
    assert len(advised) == 4  # one hint per offloaded block and forward, not one per tensor


def test_dispatch_in_memory_model_to_disk_writes_offload(tmp_path: Path) -> None:
    ref = reference()
    model = reference()
    device_map = {"embed": "cpu", "blocks.0": "cpu", "blocks.1": "disk", "blocks.2": "disk", "blocks.3": "cpu",
                  "head": "cpu", "scale": "cpu", "table": "cpu"}  # fmt: skip
    with pytest.raises(ValueError, match="offload_dir"):
        dispatch_model(reference(), device_map)
    dispatch_model(model, device_map, offload_dir=tmp_path)
    assert (tmp_path / "blocks.1.up.weight.dat").exists()
    assert torch.allclose(model(inputs()), ref(inputs()))


def test_dispatch_rejects_meta_leftovers_and_bad_devices() -> None:
    with pytest.raises(ValueError, match="still on 'meta'.*embed.weight"):
        dispatch_model(meta_toy(), {"": "cpu"})
    with pytest.raises(ValueError, match="'blocks'.*'gpu7'"):
        dispatch_model(reference(), {"": "cpu", "blocks": "gpu7"})
    with pytest.raises(ValueError, match="non-empty dict"):
        dispatch_model(reference(), {})


def test_force_hooks_on_one_device() -> None:
    model = dispatch_model(reference(), {"": "cpu"}, force_hooks=True)
    assert isinstance(model._hf_hook, AlignDevicesHook) and model._hf_hook.io_same_device
    assert torch.allclose(model(inputs()), reference()(inputs()))


def test_public_names_are_one_object() -> None:
    import accelerando.big_model.device_map as device_map
    import accelerando.big_model.dispatch as dispatch
    import accelerando.big_model.hooks as hooks
    import accelerando.big_modeling as big_modeling
    import accelerando.hooks as public_hooks
    import accelerando.inference as inference
    import accelerando.parallel.pipeline as pipeline
    import accelerando.utils.modeling as modeling
    import accelerando.utils.offload as public_offload

    assert big_modeling.dispatch_model is dispatch.dispatch_model
    assert public_hooks.AlignDevicesHook is hooks.AlignDevicesHook is big_modeling.AlignDevicesHook
    assert (
        modeling.infer_auto_device_map
        is device_map.infer_auto_device_map
        is big_modeling.infer_auto_device_map
    )
    assert inference.prepare_pippy is pipeline.prepare_pippy
    assert public_offload.OffloadedWeightsLoader is offload_module.OffloadedWeightsLoader


@pytest.mark.cuda
def test_cuda_cpu_disk_map(tmp_path: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    ref = checkpoint(tmp_path)
    device_map = {"embed": 0, "blocks.0": 0, "blocks.1": "cpu", "blocks.2": "disk", "blocks.3": 0,
                  "head": 0, "scale": 0, "table": 0}  # fmt: skip
    model = load_checkpoint_and_dispatch(meta_toy(), tmp_path, device_map=device_map)
    out = model(inputs())
    assert out.device.type == "cpu"  # io_same_device: outputs come back where the inputs were
    assert torch.allclose(out, ref(inputs()), atol=1e-5)
    assert model.blocks[1].up.weight.device.type == "meta"


@pytest.mark.cuda
def test_cuda_single_device_and_cpu_offload(tmp_path: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    ref = checkpoint(tmp_path)
    model = load_checkpoint_and_dispatch(meta_toy(), tmp_path, device_map={"": 0})
    assert not hasattr(model, "_hf_hook") and model.embed.weight.device.type == "cuda"
    compiled = torch.compile(model, backend="aot_eager")
    torch.testing.assert_close(compiled(inputs().cuda()).cpu(), ref(inputs()))
    from accelerando.big_modeling import cpu_offload

    offloaded = cpu_offload(reference(), execution_device=0)
    torch.testing.assert_close(offloaded(inputs()), ref(inputs()))


def test_moving_an_offloaded_model_is_refused(tmp_path: Path) -> None:
    from accelerando.hooks import remove_hook_from_submodules

    checkpoint(tmp_path)
    device_map = {"embed": "cpu", "blocks": "disk", "head": "cpu", "scale": "cpu", "table": "cpu"}
    model = load_checkpoint_and_dispatch(meta_toy(), tmp_path, device_map=device_map)
    with pytest.raises(RuntimeError, match="offloaded weights"):
        model.to("cpu")
    half = model.to(torch.float64)  # dtype-only casts pass; served weights follow the meta dtype
    assert half.blocks[0].up.weight.dtype == torch.float64
    assert model(inputs()).dtype == torch.float64
    remove_hook_from_submodules(model)
    assert "to" not in model.__dict__
