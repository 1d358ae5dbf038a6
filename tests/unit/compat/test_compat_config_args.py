"""`commands.config.config_args`: the files Accelerate's ClusterConfig writes load here, and back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import accelerate.commands.config.config_args as theirs
import pytest
import yaml

import accelerando.commands.config as our_package
import accelerando.commands.config.config_args as ours
from accelerando.commands.config.default import write_basic_config
from accelerando.config.yaml_config import load_config

CONFIGS: list[dict[str, Any]] = [
    {"compute_environment": "LOCAL_MACHINE", "distributed_type": "NO", "mixed_precision": "no", "use_cpu": True,
     "debug": False},
    {"compute_environment": "LOCAL_MACHINE", "distributed_type": "MULTI_CPU", "mixed_precision": "bf16",
     "use_cpu": True, "debug": True, "num_processes": 4, "num_machines": 2, "machine_rank": 1,
     "main_process_ip": "10.0.0.1", "main_process_port": 29501, "rdzv_backend": "c10d",
     "dynamo_config": {"dynamo_backend": "INDUCTOR", "dynamo_mode": "default"}},
    {"compute_environment": "LOCAL_MACHINE", "distributed_type": "FSDP", "mixed_precision": "fp16",
     "use_cpu": False, "debug": False, "num_processes": 2, "gpu_ids": "0,1",
     "fsdp_config": {"fsdp_version": 2, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                     "fsdp_state_dict_type": "SHARDED_STATE_DICT", "fsdp_offload_params": False}},
    {"compute_environment": "LOCAL_MACHINE", "distributed_type": "DEEPSPEED", "mixed_precision": "no",
     "use_cpu": False, "debug": False, "num_processes": 8,
     "deepspeed_config": {"zero_stage": 3, "offload_param_device": "cpu", "zero3_init_flag": True}},
]  # fmt: skip


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c["distributed_type"])
@pytest.mark.parametrize("suffix", ["yaml", "json"])
def test_cluster_config_files_round_trip_with_accelerate(
    tmp_path: Path, config: dict[str, Any], suffix: str
) -> None:
    their_file, our_file = tmp_path / f"theirs.{suffix}", tmp_path / f"ours.{suffix}"
    getattr(theirs.ClusterConfig(**config), f"to_{suffix}_file")(str(their_file))
    getattr(ours.ClusterConfig(**config), f"to_{suffix}_file")(our_file)
    assert our_file.read_text() == their_file.read_text()  # byte for byte the same file
    read = getattr(ours.ClusterConfig, f"from_{suffix}_file")
    read_theirs = getattr(theirs.ClusterConfig, f"from_{suffix}_file")
    assert (
        read(str(their_file)).to_dict()
        == read_theirs(str(our_file)).to_dict()
        == read_theirs(str(their_file)).to_dict()
    )
    loaded = ours.load_config_from_file(str(their_file))
    assert isinstance(loaded, ours.ClusterConfig)
    assert loaded.distributed_type == config["distributed_type"]
    assert loaded.fsdp_config == config.get("fsdp_config", {})
    # the launcher reads the same file through the same reader
    launch = load_config(our_file)
    assert launch.values["mixed_precision"] == config["mixed_precision"]


def test_sagemaker_and_legacy_files_and_refusals(tmp_path: Path) -> None:
    sage = {"compute_environment": "AMAZON_SAGEMAKER", "distributed_type": "DATA_PARALLEL", "mixed_precision": "no",
            "use_cpu": False, "debug": False, "ec2_instance_type": "ml.p3.2xlarge", "iam_role_name": "role"}  # fmt: skip
    path = tmp_path / "sage.yaml"
    theirs.SageMakerConfig(**sage).to_yaml_file(str(path))
    loaded = ours.load_config_from_file(str(path))
    assert isinstance(loaded, ours.SageMakerConfig)
    assert loaded.to_dict() == theirs.load_config_from_file(str(path)).to_dict()

    legacy = tmp_path / "legacy.yaml"
    legacy.write_text("distributed_type: MULTI_CPU\nfp16: true\n")
    assert ours.ClusterConfig.from_yaml_file(legacy).mixed_precision == "fp16"
    assert theirs.ClusterConfig.from_yaml_file(str(legacy)).mixed_precision == "fp16"

    (tmp_path / "bad.yaml").write_text("distributed_type: NO\nwhat_is_this: 1\n")
    with pytest.raises(ValueError, match=r"unknown keys \(\['what_is_this'\]\)"):
        ours.ClusterConfig.from_yaml_file(tmp_path / "bad.yaml")
    (tmp_path / "none.yaml").write_text("mixed_precision: 'no'\n")
    with pytest.raises(ValueError, match="A `distributed_type` must be specified"):
        ours.load_config_from_file(str(tmp_path / "none.yaml"))
    with pytest.raises(ValueError, match="distributed_type 'MULTI_TPU' is not one of NO, MULTI_CPU"):
        ours.ClusterConfig("LOCAL_MACHINE", "MULTI_TPU", "no", False, False)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ours.load_config_from_file(str(tmp_path / "missing.yaml"))


def test_paths_and_basic_config(tmp_path: Path) -> None:
    assert ours.default_yaml_config_file == ours.default_json_config_file
    assert ours.default_yaml_config_file.endswith("default_config.yaml")
    assert Path(ours.cache_dir).name == "accelerando"
    assert our_package.load_config_from_file is ours.load_config_from_file
    target = tmp_path / "basic.yaml"
    assert write_basic_config("BF16", target) == target
    basic = ours.load_config_from_file(str(target))
    assert (basic.mixed_precision, basic.use_cpu, basic.num_processes) == ("bf16", True, 1)
    assert yaml.safe_load(target.read_text())["distributed_type"] == "NO"
    assert write_basic_config("no", target) is False  # an existing file is left alone
    with pytest.raises(ValueError, match="'fp4' is not one of no, fp16, bf16, fp8"):
        write_basic_config("fp4", tmp_path / "other.yaml")
