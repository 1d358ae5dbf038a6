"""`save_fsdp_model` & co. in one process, the Accelerator arguments transformers' Trainer passes,
and state objects that pickle (Trainer saves its TrainingArguments, holding a PartialState).

The 2-rank FSDP paths (FULL_STATE_DICT through the Trainer, DCP and per-rank files) and
`adapter_only` with a peft LoRA model run in tests/distributed/test_accelerate_dropin.py.
"""

from __future__ import annotations

import copy
import pickle
from pathlib import Path

import pytest
import torch

from accelerando import Accelerator, FullyShardedDataParallelPlugin
from accelerando.state import AcceleratorState, GradientState, PartialState
from accelerando.utils import load_fsdp_model, load_fsdp_optimizer, save_fsdp_model, save_fsdp_optimizer


def _trained(accelerator: Accelerator) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.backward(model(torch.randn(16, 4)).square().mean())
    optimizer.step()
    return model, optimizer


def _wipe(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    for state in optimizer.optimizer.state.values():
        state["exp_avg"].zero_()


@pytest.mark.parametrize(
    ("kind", "use_dcp", "files"),
    [
        ("FULL_STATE_DICT", True, ["optimizer.bin", "pytorch_model_fsdp.bin"]),
        ("SHARDED_STATE_DICT", True, ["optimizer_0", "pytorch_model_fsdp_0"]),
        ("SHARDED_STATE_DICT", False, ["optimizer_0_rank0.bin", "pytorch_model_fsdp_0_rank0.bin"]),
    ],
)
def test_round_trip_with_accelerates_file_names(
    tmp_path: Path, kind: str, use_dcp: bool, files: list[str]
) -> None:
    accelerator = Accelerator(cpu=True)
    model, optimizer = _trained(accelerator)
    plugin = FullyShardedDataParallelPlugin(state_dict_type=kind)
    weights = copy.deepcopy(model.state_dict())
    moments = copy.deepcopy(optimizer.optimizer.state_dict())
    save_fsdp_model(plugin, accelerator, model, tmp_path, use_dcp=use_dcp)
    save_fsdp_optimizer(plugin, accelerator, optimizer, model, tmp_path, use_dcp=use_dcp)
    assert sorted(p.name for p in tmp_path.iterdir()) == files  # no temporary names left
    _wipe(model, optimizer)
    load_fsdp_model(plugin, accelerator, model, tmp_path, use_dcp=use_dcp)
    load_fsdp_optimizer(plugin, accelerator, optimizer, model, tmp_path, use_dcp=use_dcp)
    for key, value in weights.items():
        assert torch.equal(model.state_dict()[key], value), key
    for key, value in moments["state"].items():
        assert torch.equal(
            optimizer.optimizer.state[list(model.parameters())[key]]["exp_avg"], value["exp_avg"]
        )


def test_full_state_file_is_what_accelerate_writes(tmp_path: Path) -> None:
    """A plain `torch.save` of the state dict, readable by `torch.load(weights_only=True)`."""
    accelerator = Accelerator(cpu=True)
    model, _ = _trained(accelerator)
    save_fsdp_model(
        FullyShardedDataParallelPlugin(state_dict_type="FULL_STATE_DICT"), accelerator, model, tmp_path, 1
    )
    saved = torch.load(tmp_path / "pytorch_model_fsdp_1.bin", weights_only=True)
    assert saved.keys() == model.state_dict().keys()


def test_loading_the_other_format_names_what_is_missing(tmp_path: Path) -> None:
    accelerator = Accelerator(cpu=True)
    model, _ = _trained(accelerator)
    save_fsdp_model(
        FullyShardedDataParallelPlugin(state_dict_type="FULL_STATE_DICT"), accelerator, model, tmp_path
    )
    sharded = FullyShardedDataParallelPlugin(state_dict_type="SHARDED_STATE_DICT")
    with pytest.raises(FileNotFoundError, match="SHARDED_STATE_DICT"):
        load_fsdp_model(sharded, accelerator, model, tmp_path)


@pytest.mark.parametrize("name", ["megatron_lm_plugin"])
def test_engine_arguments_accept_none_and_refuse_a_value(name: str) -> None:
    Accelerator(cpu=True, **{name: None})  # what transformers' Trainer passes every time
    with pytest.raises(NotImplementedError, match=rf"{name}=object.*not available yet"):
        Accelerator(cpu=True, **{name: object()})


def test_parallelism_config_accepts_none_and_names_a_wrong_type() -> None:
    Accelerator(cpu=True, parallelism_config=None)
    with pytest.raises(TypeError, match="parallelism_config must be a ParallelismConfig, got object"):
        Accelerator(cpu=True, parallelism_config=object())


@pytest.mark.parametrize("name", ["deepspeed_plugin", "deepspeed_plugins"])
def test_deepspeed_arguments_accept_none_and_name_a_wrong_type(name: str) -> None:
    Accelerator(cpu=True, **{name: None})  # what transformers' Trainer passes every time
    with pytest.raises(TypeError, match="must be a DeepSpeedPlugin, got object"):
        Accelerator(cpu=True, **{name: object()})


def test_state_objects_pickle_as_views_of_this_process() -> None:
    accelerator = Accelerator(cpu=True)
    _trained(accelerator)
    for state in (PartialState(), AcceleratorState(), GradientState()):
        data = pickle.dumps(state)
        assert len(data) < 500  # the runtime (models, process group) stays behind
        copy_ = pickle.loads(data)
        assert type(copy_) is type(state)
    assert pickle.loads(pickle.dumps(AcceleratorState())).device == accelerator.device
    assert pickle.loads(pickle.dumps(GradientState())).sync_gradients is True
