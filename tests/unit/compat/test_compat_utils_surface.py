"""The rest of `accelerate.utils`' pure helpers and probes, each compared with Accelerate's own output."""

from __future__ import annotations

import io
import logging

import numpy as np
import pytest
import torch
from torch import nn

import accelerando.utils as ours

theirs = pytest.importorskip("accelerate.utils")

PROBES = """is_peft_available is_timm_available is_torchvision_available is_pandas_available
is_matplotlib_available is_boto3_available is_schedulefree_available is_lomo_available is_torchdata_available
is_sagemaker_available is_import_timer_available is_amdsmi_available is_pynvml_available is_triton_available
is_transformer_engine_available is_bnb_available is_4bit_bnb_available is_8bit_bnb_available is_rocm_available
is_xccl_available is_musa_available is_sdaa_available is_neuron_available is_megatron_lm_available
is_habana_gaudi1 is_bitsandbytes_multi_backend_available is_transformer_engine_mxfp8_available""".split()


@pytest.mark.parametrize("name", PROBES)
def test_availability_probes_answer_as_accelerate_on_this_machine(name: str) -> None:
    assert bool(getattr(ours, name)()) == bool(getattr(theirs, name)())


def test_constants_equal_accelerates() -> None:
    for name in ("PROFILE_PATTERN_NAME", "TORCH_LAUNCH_PARAMS", "TORCH_DISTRIBUTED_OPERATION_TYPES"):
        assert getattr(ours, name) == getattr(theirs, name), name


def test_small_pure_helpers_equal_accelerates() -> None:
    for size in (0, 1, 1023, 1024, 1536, 10**6, 3 * 2**30, 2**40, 7 * 2**50, 123456.789):
        assert ours.convert_bytes(size) == theirs.convert_bytes(size)
    src = {"a": {"b": 1, "c": {"d": 2}}, "e": 3}
    assert ours.merge_dicts(src, {"a": {"x": 0, "c": {"y": 1}}, "e": 0}) == theirs.merge_dicts(
        src, {"a": {"x": 0, "c": {"y": 1}}, "e": 0}
    )
    model = nn.Sequential(nn.Linear(2, 3), nn.Sequential(nn.ReLU(), nn.Linear(3, 1)))
    assert ours.recursive_getattr(model, "1.1.weight") is theirs.recursive_getattr(model, "1.1.weight")
    for fqns in (False, True):
        mine = ours.get_module_children_bottom_up(model, return_fqns=fqns)
        reference = theirs.get_module_children_bottom_up(model, return_fqns=fqns)
        assert [repr(x) for x in mine] == [repr(x) for x in reference]
    compiled_inside = nn.Sequential(torch.compile(nn.Linear(2, 2)))
    for m in (model, torch.compile(model), compiled_inside, nn.Linear(1, 1)):
        assert ours.is_compiled_module(m) == theirs.is_compiled_module(m)
        assert ours.has_compiled_regions(m) == theirs.has_compiled_regions(m)
        assert ours.model_has_dtensor(m) == theirs.model_has_dtensor(m)
    assert ours.is_peft_model(model) == theirs.is_peft_model(model) is False


def test_tensor_structure_helpers_equal_accelerates() -> None:
    data = {"x": torch.ones(4, 2), "y": [torch.zeros(4, dtype=torch.int64), (torch.ones(4, 3, 1),)]}
    mine, reference = ours.get_data_structure(data), theirs.get_data_structure(data)
    assert repr(mine).replace("accelerando", "accelerate") == repr(reference)
    assert ours.is_tensor_information(mine["x"]) and not ours.is_tensor_information(data["x"])
    assert ours.is_torch_tensor(data["x"]) == theirs.is_torch_tensor(data["x"]) is True
    built = ours.initialize_tensors(mine)
    assert [(t.shape, t.dtype) for t in (built["x"], built["y"][0], built["y"][1][0])] == [
        (t.shape, t.dtype) for t in (data["x"], data["y"][0], data["y"][1][0])
    ]
    for nest in (data, {"a": 1}, [], [torch.ones(5)]):
        assert ours.ignorant_find_batch_size(nest) == theirs.ignorant_find_batch_size(nest)


def test_env_readers_equal_accelerates(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERANDO_T_A", "-1")
    monkeypatch.setenv("ACCELERANDO_T_B", "3")
    monkeypatch.setenv("ACCELERANDO_T_MP", "bf16")
    for keys in (["ACCELERANDO_T_A", "ACCELERANDO_T_B"], ["ACCELERANDO_T_A"], ["ACCELERANDO_T_UNSET"]):
        assert ours.get_int_from_env(keys, 7) == theirs.get_int_from_env(keys, 7)
    for key in ("ACCELERANDO_T_MP", "ACCELERANDO_T_UNSET"):
        assert ours.parse_choice_from_env(key) == theirs.parse_choice_from_env(key)


def test_clean_state_dict_for_safetensors_keeps_the_same_names_and_warns_alike(caplog) -> None:
    def state() -> dict[str, object]:
        w = torch.ones(4, 4)
        return {"a": w, "b": w, "c": w.t(), "d": torch.zeros(2), "s": "bnb-serialised"}

    pytest.importorskip("accelerate").PartialState(cpu=True)  # their warning goes through their logger
    with caplog.at_level(logging.WARNING):
        mine = ours.clean_state_dict_for_safetensors(state())
        reference = theirs.clean_state_dict_for_safetensors(state())
    assert list(mine) == list(reference) == ["a", "d", "s"]
    assert all(v.is_contiguous() for v in mine.values() if isinstance(v, torch.Tensor))
    warned = [r.getMessage() for r in caplog.records if "Removed shared tensor" in r.getMessage()]
    assert len(warned) == 2 and warned[1].endswith(warned[0])  # theirs prefixes "[RANK 0] "


def test_load_reads_numpy_rng_states_with_weights_only_as_accelerate() -> None:
    buffer = io.BytesIO()
    torch.save({"numpy": np.random.get_state(), "t": torch.arange(3)}, buffer)
    for load in (ours.load, theirs.load):
        buffer.seek(0)
        loaded = load(buffer)
        assert torch.equal(loaded["t"], torch.arange(3)) and loaded["numpy"][0] == "MT19937"


def test_device_and_library_helpers_equal_accelerates() -> None:
    for device in (0, 3, "cpu", "npu", "cuda:1", torch.device("cpu"), "disk"):
        assert ours.normalize_device(device) == theirs.normalize_device(device)
    names = ("torch", "numpy", "no_such_library_here")
    assert (
        ours.are_libraries_initialized(*names)
        == theirs.are_libraries_initialized(*names)
        == ["torch", "numpy"]
    )
    assert {d.name for d in ours.CustomDtype} == {d.name for d in theirs.CustomDtype}
    for custom in theirs.CustomDtype:
        assert ours.dtype_byte_size(custom) == theirs.dtype_byte_size(custom)


def test_backend_device_type_and_tp_size_helpers_equal_accelerates() -> None:
    from accelerate.utils.constants import TORCH_DISTRIBUTED_BACKENDS

    from accelerando.utils.constants import TORCH_DISTRIBUTED_BACKENDS as mine

    assert mine == TORCH_DISTRIBUTED_BACKENDS
    for device_type in (None, "cpu", "cuda", "npu", "xpu", "hpu", "mps"):
        assert ours.get_distributed_backend(device_type) == theirs.get_distributed_backend(device_type)
    assert ours.get_current_device_type() == theirs.get_current_device_type()

    class Config:
        def __init__(self, distributed_config: object) -> None:
            self.distributed_config = distributed_config

    models = [nn.Linear(1, 1), nn.Linear(1, 1), nn.Linear(1, 1), nn.Linear(1, 1)]
    models[1].tp_size = 4
    models[2].config = Config({"tp_size": 2})
    models[3].config = Config(Config(None))
    models[3].config.distributed_config.tp_size = 8
    for model in models:
        assert ours.get_model_tp_size(model) == theirs.get_model_tp_size(model)


def test_required_decorators_guard_like_accelerates() -> None:
    def needs_ao() -> str:
        return "ran"

    for module in (ours, theirs):
        guarded = module.torchao_required(needs_ao)
        if ours.is_torchao_available():
            assert guarded() == "ran"
        else:
            with pytest.raises(ImportError, match="torchao"):
                guarded()
    assert ours.deepspeed_required(needs_ao)() == "ran"  # no Accelerator yet: nothing to check
