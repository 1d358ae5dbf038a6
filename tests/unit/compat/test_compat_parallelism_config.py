"""ParallelismConfig and its handlers: same fields, defaults, properties and refusals as Accelerate's."""

from __future__ import annotations

import warnings
from types import SimpleNamespace
from typing import Any

import accelerate.parallelism_config as their_pc
import accelerate.utils.dataclasses as their_dc
import pytest

import accelerando.parallelism_config as our_pc
import accelerando.utils.dataclasses as our_dc

PROPERTIES = [
    "dp_dim_names", "non_dp_dim_names", "dp_shard_cp_dim_names", "dp_cp_dim_names", "fsdp_dim_names",
    "total_size", "non_data_parallel_size", "data_parallel_size", "dp_replicate_enabled", "dp_shard_enabled",
    "tp_enabled", "cp_enabled", "sp_enabled", "active_mesh_dims",
]  # fmt: skip

# (arguments, None when both accept it, else a phrase both error messages contain)
CASES: list[tuple[dict[str, Any], str | None]] = [
    ({}, None),
    ({"dp_shard_size": 4}, None),
    ({"dp_replicate_size": 2, "dp_shard_size": 2}, None),
    ({"dp_replicate_size": 2}, None),
    ({"tp_size": 2, "dp_shard_size": 2}, None),
    ({"cp_size": 2, "dp_shard_size": 2}, None),
    ({"cp_size": 2, "dp_replicate_size": 2, "dp_shard_size": 2, "tp_size": 2}, None),
    ({"sp_size": 4}, None),
    ({"sp_size": 2, "dp_shard_size": 2}, None),
    ({"dp_replicate_size": 0}, "dp_replicate_size must be at least 1"),
    ({"dp_shard_size": -1}, "dp_shard_size must be at least 1"),
    ({"tp_size": 0}, "tp_size must be at least 1"),
    ({"cp_size": 0}, "cp_size must be at least 1"),
    ({"sp_size": 0}, "sp_size must be at least 1"),
    ({"cp_backend": "ring"}, "cp_backend must be one of"),
    ({"sp_backend": "ulysses"}, "sp_backend must be one of"),
    ({"cp_size": 2, "sp_size": 2}, "mutually exclusive"),
    ({"cp_size": 2, "dp_replicate_size": 2}, "cannot be used with pure data parallelism"),
    ({"cp_size": 2, "cp_handler": "sp"}, "requires"),
    ({"sp_size": 2, "sp_handler": "sp-fixed-no-length"}, "sp_seq_length"),
]


def _build(module: Any, dataclasses: Any, kwargs: dict[str, Any]) -> Any:
    kwargs = dict(kwargs)
    if kwargs.get("cp_handler") == "sp":
        kwargs["cp_handler"] = dataclasses.DeepSpeedSequenceParallelConfig()
    if kwargs.get("sp_handler") == "sp-fixed-no-length":
        kwargs["sp_handler"] = dataclasses.DeepSpeedSequenceParallelConfig(sp_seq_length_is_variable=False)
    return module.ParallelismConfig(**kwargs)


def _outcome(module: Any, dataclasses: Any, kwargs: dict[str, Any]) -> Any:
    try:
        config = _build(module, dataclasses, kwargs)
    except (ValueError, TypeError) as err:
        return type(err), str(err)
    values = {name: getattr(config, name) for name in PROPERTIES}
    values["mesh"] = config._get_mesh()
    values["handlers"] = [type(getattr(config, f"{d}_handler")).__name__ for d in ("tp", "cp", "sp")]
    values["sizes"] = dict(config._sizes)
    values["fields"] = [config.cp_backend, config.sp_backend]
    return values


@pytest.mark.parametrize(("kwargs", "phrase"), CASES)
def test_parallelism_config_matches_accelerate(kwargs: dict[str, Any], phrase: str | None) -> None:
    mine, reference = _outcome(our_pc, our_dc, kwargs), _outcome(their_pc, their_dc, kwargs)
    if phrase is None:
        assert isinstance(mine, dict), mine
        assert mine == reference
    else:
        assert isinstance(mine, tuple) and isinstance(reference, tuple), (mine, reference)
        assert mine[0] is reference[0]
        assert phrase in mine[1] and phrase in reference[1], (mine[1], reference[1])


def test_sizes_and_backends_default_from_the_launchers_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {
        "DP_SHARD_SIZE": "2",
        "TP_SIZE": "2",
        "CP_SIZE": "1",
        "CP_COMM_STRATEGY": "alltoall",
    }.items():
        monkeypatch.setenv(f"PARALLELISM_CONFIG_{name}", value)
    mine, reference = _outcome(our_pc, our_dc, {}), _outcome(their_pc, their_dc, {})
    assert mine == reference and mine["total_size"] == 4
    assert our_dc.TorchContextParallelConfig().cp_comm_strategy == "alltoall"
    monkeypatch.setenv("PARALLELISM_CONFIG_TP_SIZE", "two")
    with pytest.raises(ValueError, match="PARALLELISM_CONFIG_TP_SIZE='two' is not an integer"):
        our_pc.ParallelismConfig()


def test_to_json_and_repr() -> None:
    config = our_pc.ParallelismConfig(dp_shard_size=2, cp_size=2)
    reference = their_pc.ParallelismConfig(dp_shard_size=2, cp_size=2)
    assert config.to_json() == reference.to_json()
    assert "dp_shard_size=2" in repr(config) and "total_size=4" in repr(config)


def _accelerator(**overrides: Any) -> SimpleNamespace:
    base = {"multi_device": True, "num_processes": 4, "is_fsdp2": False, "distributed_type": "MULTI_CPU"}
    return SimpleNamespace(is_main_process=True, **{**base, **overrides})


VALIDATIONS: list[tuple[dict[str, Any], dict[str, Any]]] = [
    ({}, {"multi_device": False, "num_processes": 1}),
    ({}, {}),
    ({"dp_shard_size": 4}, {"is_fsdp2": True}),
    ({"dp_shard_size": 2}, {}),
    ({"tp_size": 4}, {"is_fsdp2": True}),
    ({"dp_shard_size": 4}, {"multi_device": False, "distributed_type": "NO"}),
    ({"sp_size": 2}, {"num_processes": 8}),
]


@pytest.mark.parametrize(("kwargs", "accelerator"), VALIDATIONS)
def test_validate_accelerator_matches_accelerate(kwargs: dict[str, Any], accelerator: dict[str, Any]) -> None:
    results = []
    for module, dataclasses in ((our_pc, our_dc), (their_pc, their_dc)):
        config = _build(module, dataclasses, kwargs)
        try:
            config._validate_accelerator(_accelerator(**accelerator))
            results.append(("ok", dict(config._sizes), config.dp_replicate_size))
        except ValueError as err:
            results.append(("error", str(err).split(" ")[0]))
    assert results[0] == results[1]


def test_unused_handler_warns_like_accelerate() -> None:
    for module, dataclasses in ((our_pc, our_dc), (their_pc, their_dc)):
        config = module.ParallelismConfig(
            dp_shard_size=4, cp_handler=dataclasses.TorchContextParallelConfig()
        )
        with pytest.warns(UserWarning, match="cp_handler is set, but cp_size is set to 1"):
            config._validate_accelerator(_accelerator(is_fsdp2=True))


def test_build_device_mesh_names_every_dimension_and_the_flattened_ones() -> None:
    """Built over torch's fake process group (one process playing rank 6 of 8)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    config = our_pc.ParallelismConfig(dp_replicate_size=2, dp_shard_size=2, tp_size=2)
    with pytest.raises(RuntimeError, match="needs the process group"):
        config.build_device_mesh("cpu")
    with pytest.raises(ValueError, match="device_type"):
        config.get_device_mesh()
    dist.init_process_group("fake", store=FakeStore(), rank=6, world_size=8)
    try:
        mesh = config.get_device_mesh("cpu")
        assert mesh.mesh_dim_names == ("dp_replicate", "dp_shard", "cp", "tp")
        assert tuple(mesh.shape) == (2, 2, 1, 2)
        assert mesh["tp"].mesh.tolist() == [6, 7]
        assert mesh["dp"].mesh.tolist() == [0, 2, 4, 6]
        assert mesh["dp_shard_cp"].mesh.tolist() == [4, 6]
        assert mesh["dp_cp"].mesh.tolist() == [0, 2, 4, 6]
        assert config.get_device_mesh() is mesh
        with pytest.raises(ValueError, match=r"tp_size=4 = 16, but the job has 8 processes"):
            our_pc.ParallelismConfig(dp_replicate_size=2, dp_shard_size=2, tp_size=4).build_device_mesh("cpu")
    finally:
        dist.destroy_process_group()


HANDLER_CASES: list[tuple[str, dict[str, Any]]] = [
    ("TorchContextParallelConfig", {}),
    ("TorchContextParallelConfig", {"cp_comm_strategy": "alltoall"}),
    ("TorchContextParallelConfig", {"cp_comm_strategy": "ring"}),
    ("DeepSpeedSequenceParallelConfig", {}),
    ("DeepSpeedSequenceParallelConfig", {"sp_seq_length_is_variable": False, "sp_seq_length": 128}),
    ("DeepSpeedSequenceParallelConfig", {"sp_seq_length_is_variable": False}),
    ("DeepSpeedSequenceParallelConfig", {"sp_attn_implementation": "sdpa"}),
    ("DeepSpeedSequenceParallelConfig", {"sp_attn_implementation": "eager"}),
    ("DeepSpeedSequenceParallelConfig", {"sp_attn_implementation": "kernels-community/flash-attn2"}),
    ("DeepSpeedSequenceParallelConfig", {"sp_attn_implementation": "kernels-community/other"}),
    ("TorchTensorParallelConfig", {}),
]


@pytest.mark.parametrize(("name", "kwargs"), HANDLER_CASES)
def test_handlers_match_accelerate(name: str, kwargs: dict[str, Any]) -> None:
    outcomes = []
    for dataclasses in (our_dc, their_dc):
        try:
            fields = vars(getattr(dataclasses, name)(**kwargs))
            outcomes.append({k: v for k, v in fields.items() if k != "tp_plan"})  # accelerando's addition
        except ValueError as err:
            outcomes.append(str(err)[:40])
    assert outcomes[0] == outcomes[1]


def test_sequence_parallel_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARALLELISM_CONFIG_SP_SEQ_LENGTH_IS_VARIABLE", "false")
    monkeypatch.setenv("PARALLELISM_CONFIG_SP_SEQ_LENGTH", "256")
    monkeypatch.setenv("PARALLELISM_CONFIG_SP_DISABLE_IN_EVAL", "false")
    assert vars(our_dc.DeepSpeedSequenceParallelConfig()) == vars(their_dc.DeepSpeedSequenceParallelConfig())
    assert our_dc.DeepSpeedSequenceParallelConfig().sp_seq_length == 256


def test_async_tensor_parallelism_warns() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        our_dc.TorchTensorParallelConfig(enable_async_tp=True)
    assert any("Async tensor parallelism" in str(w.message) for w in caught)
