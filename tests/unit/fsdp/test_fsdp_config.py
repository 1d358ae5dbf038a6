"""FullyShardedDataParallelPlugin: FSDP1 -> FSDP2 mapping, environment, YAML keys, errors."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

from accelerando.config import fsdp as cfg
from accelerando.config.env import patch_environment
from accelerando.config.fsdp import FullyShardedDataParallelPlugin as Plugin


@pytest.fixture(autouse=True)
def _fresh_warnings() -> None:
    cfg._WARNED.clear()


def test_defaults_are_fsdp2_sharded() -> None:
    p = Plugin()
    assert p.fsdp_version == 2 and p.reshard_after_forward is True
    assert p.state_dict_type == cfg.SHARDED_STATE_DICT
    assert p.cpu_offload is None and p.mixed_precision_policy is None
    assert not p.cpu_ram_efficient_loading and not p.sync_module_states and not p.hybrid_shard


@pytest.mark.parametrize(
    ("strategy", "reshard", "hybrid"),
    [
        ("FULL_SHARD", True, False),
        ("SHARD_GRAD_OP", False, False),
        ("HYBRID_SHARD", True, True),
        ("HYBRID_SHARD_ZERO2", False, True),
        ("2", False, False),
    ],
)
def test_sharding_strategy_maps_to_reshard_after_forward(strategy: str, reshard: bool, hybrid: bool) -> None:
    p = Plugin(sharding_strategy=strategy)
    assert p.reshard_after_forward is reshard and p.hybrid_shard is hybrid


def test_fsdp1_enum_and_strategy_name_in_reshard_field() -> None:
    from torch.distributed.fsdp import ShardingStrategy

    assert Plugin(sharding_strategy=ShardingStrategy.SHARD_GRAD_OP).reshard_after_forward is False
    assert Plugin(reshard_after_forward="SHARD_GRAD_OP").reshard_after_forward is False
    assert Plugin(reshard_after_forward="false").reshard_after_forward is False


def test_no_shard_is_refused_with_the_alternative() -> None:
    with pytest.raises(ValueError, match="NO_SHARD.*DistributedDataParallel"):
        Plugin(sharding_strategy="NO_SHARD")
    with pytest.raises(ValueError, match="accepted: FULL_SHARD"):
        Plugin(sharding_strategy="ZERO3")


def test_options_without_effect_warn_once() -> None:
    with pytest.warns(UserWarning, match="BACKWARD_POST has no effect"):
        Plugin(backward_prefetch="BACKWARD_POST")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Plugin(backward_prefetch="BACKWARD_POST")  # second time: silent
        Plugin(backward_prefetch="BACKWARD_PRE", use_orig_params=True)  # FSDP2's own behaviour
    with pytest.warns(UserWarning, match="use_orig_params=False"):
        Plugin(use_orig_params=False)
    with pytest.warns(UserWarning, match="fsdp_version=1"):
        Plugin(fsdp_version=1)
    with pytest.raises(ValueError, match="backward_prefetch"):
        Plugin(backward_prefetch="SOMETIMES")


def test_mixed_precision_forms() -> None:
    p = Plugin(mixed_precision_policy="bf16").mixed_precision_policy
    assert p == MixedPrecisionPolicy(torch.bfloat16, torch.float32, torch.float32)
    d = Plugin(mixed_precision_policy={"param_dtype": "fp16", "reduce_dtype": torch.float32})
    assert d.mixed_precision_policy.param_dtype == torch.float16
    assert Plugin(mixed_precision_policy="fp32").mixed_precision_policy is None
    with pytest.raises(ValueError, match="fp8"):
        Plugin(mixed_precision_policy="fp8")
    with pytest.raises(TypeError, match="MixedPrecisionPolicy"):
        Plugin(mixed_precision_policy=3)


def test_cpu_offload_never_pins_without_an_accelerator() -> None:
    policy = Plugin(cpu_offload=True).cpu_offload
    assert isinstance(policy, CPUOffloadPolicy) and policy.pin_memory is torch.accelerator.is_available()


def test_state_dict_type_and_wrap_policy_validation() -> None:
    assert Plugin(state_dict_type="FULL_STATE_DICT").state_dict_type == cfg.FULL_STATE_DICT
    with pytest.raises(ValueError, match="LOCAL_STATE_DICT"):
        Plugin(state_dict_type="LOCAL_STATE_DICT")
    assert Plugin(auto_wrap_policy="TRANSFORMER_BASED_WRAP").auto_wrap_policy == "transformer_based_wrap"
    with pytest.raises(ValueError, match="size_based_wrap"):
        Plugin(auto_wrap_policy="by_vibes")
    with pytest.raises(ValueError, match="sync_module_states"):
        Plugin(cpu_ram_efficient_loading=True, sync_module_states=False)
    assert Plugin(cpu_ram_efficient_loading=True).sync_module_states is True


def test_environment_fills_unset_fields_only() -> None:
    values = {
        "FSDP_VERSION": "2",
        "FSDP_RESHARD_AFTER_FORWARD": "false",
        "FSDP_OFFLOAD_PARAMS": "true",
        "FSDP_AUTO_WRAP_POLICY": "SIZE_BASED_WRAP",
        "FSDP_MIN_NUM_PARAMS": "123",
        "FSDP_TRANSFORMER_CLS_TO_WRAP": "A, B",
        "FSDP_STATE_DICT_TYPE": "FULL_STATE_DICT",
        "FSDP_ACTIVATION_CHECKPOINTING": "1",
        "FSDP_CPU_RAM_EFFICIENT_LOADING": "true",
    }
    with patch_environment(**values):
        p = Plugin(min_num_params=7)
    assert p.reshard_after_forward is False and isinstance(p.cpu_offload, CPUOffloadPolicy)
    assert p.auto_wrap_policy == "size_based_wrap" and p.min_num_params == 7  # explicit wins
    assert p.transformer_cls_names_to_wrap == ["A", "B"] and p.state_dict_type == cfg.FULL_STATE_DICT
    assert p.activation_checkpointing and p.cpu_ram_efficient_loading and p.sync_module_states
    with (
        patch_environment(FSDP_MIN_NUM_PARAMS="many"),
        pytest.raises(ValueError, match="FSDP_MIN_NUM_PARAMS"),
    ):
        Plugin()


def test_yaml_fsdp_config_maps_to_environment() -> None:
    env = cfg.fsdp_config_to_env(
        {
            "fsdp_version": 2,
            "fsdp_offload_params": False,
            "fsdp_transformer_layer_cls_to_wrap": ["Block", "Head"],
            "fsdp_backward_prefetch": "BACKWARD_PRE",
            "fsdp_ignored_modules": None,
        }
    )
    assert env == {
        "FSDP_VERSION": "2",
        "FSDP_OFFLOAD_PARAMS": "false",
        "FSDP_TRANSFORMER_CLS_TO_WRAP": "Block,Head",
        "FSDP_BACKWARD_PREFETCH": "BACKWARD_PRE",
    }
    with pytest.raises(ValueError, match="renamed.*'fsdp_backward_prefetch'"):
        cfg.fsdp_config_to_env({"fsdp_backward_prefetch_policy": "BACKWARD_PRE"})
    with pytest.raises(ValueError, match="unknown fsdp_config key 'fsdp_turbo'"):
        cfg.fsdp_config_to_env({"fsdp_turbo": True})
    with pytest.raises(ValueError, match="FSDP_OFFLOAD_PARAMS"):
        cfg.fsdp_config_to_env({"fsdp_offload_params": "maybe"})


def test_ignored_modules_by_object_or_regex() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    assert Plugin(ignored_modules=[model[0]]).ignored_parameters(model) == set(model[0].parameters())
    assert Plugin(ignored_modules="1").ignored_parameters(model) == set(model[1].parameters())
