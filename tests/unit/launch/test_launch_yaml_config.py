"""Accelerate config files load unchanged; unknown keys warn; files are written atomically."""

from __future__ import annotations

from pathlib import Path

import pytest

from accelerando.config import yaml_config as yc

ACCELERATE_FSDP = """\
compute_environment: LOCAL_MACHINE
debug: false
distributed_type: FSDP
downcast_bf16: 'no'
enable_cpu_affinity: false
fsdp_config:
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_offload_params: false
  fsdp_state_dict_type: SHARDED_STATE_DICT
  fsdp_transformer_layer_cls_to_wrap: BertLayer
machine_rank: 0
main_training_function: main
mixed_precision: 'no'
num_machines: 1
num_processes: 2
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: false
"""


def test_accelerate_fsdp_file_flattens(tmp_path: Path) -> None:
    path = tmp_path / "fsdp.yaml"
    path.write_text(ACCELERATE_FSDP)
    cfg = yc.load_config(path)
    assert cfg.values["use_fsdp"] is True and cfg.keys["use_fsdp"] == "distributed_type: FSDP"
    assert cfg.values["fsdp_transformer_layer_cls_to_wrap"] == "BertLayer"
    assert cfg.values["num_processes"] == 2 and cfg.values["cpu"] is False


def test_legacy_keys_migrate_and_json_in_yaml_loads(tmp_path: Path) -> None:
    path = tmp_path / "old.yaml"
    path.write_text(
        '{"distributed_type": "MULTI_CPU", "fp16": true, "dynamo_backend": "EAGER", "num_processes": -1}'
    )
    cfg = yc.load_config(path)
    assert cfg.values["mixed_precision"] == "fp16" and cfg.values["dynamo_backend"] == "eager"
    assert cfg.values["cpu"] is True and "num_processes" not in cfg.values


def test_fp8_section_uses_its_own_key_names(tmp_path: Path) -> None:
    path = tmp_path / "fp8.yaml"
    path.write_text("distributed_type: MULTI_GPU\nfp8_config:\n  backend: TE\n  amax_history_len: 16\n")
    cfg = yc.load_config(path)
    assert cfg.values["fp8_backend"] == "TE" and cfg.values["fp8_amax_history_len"] == 16


def test_unknown_keys_warn_and_bad_type_raises(tmp_path: Path) -> None:
    path = tmp_path / "x.yaml"
    path.write_text("distributed_type: 'NO'\nmade_up_key: 1\nfsdp_config:\n  fsdp_bogus: 2\n")
    with pytest.warns(UserWarning, match="unknown keys ignored: fsdp_config.fsdp_bogus, made_up_key"):
        yc.load_config(path)
    path.write_text("distributed_type: QUANTUM\n")
    with pytest.raises(ValueError, match="distributed_type 'QUANTUM' is not one of"):
        yc.load_config(path)
    with pytest.raises(ValueError, match="does not exist"):
        yc.load_config(tmp_path / "missing.yaml")


def test_save_is_atomic_and_round_trips(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "default_config.yaml"
    yc.save_config(yc.basic_config("bf16", "cpu", 0), target)
    assert [p.name for p in target.parent.iterdir()] == ["default_config.yaml"]
    assert yc.load_config(target).values["mixed_precision"] == "bf16"
    with pytest.raises(ValueError, match="mixed_precision 'fp64'"):
        yc.basic_config("fp64", "cpu", 0)


def test_default_locations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ACCELERANDO_CONFIG_FILE", raising=False)
    monkeypatch.delenv("ACCELERATE_CONFIG_FILE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    assert yc.default_config_path() == tmp_path / "accelerando" / "default_config.yaml"
    assert yc.find_default_config() is None
    theirs = tmp_path / "accelerate" / "default_config.yaml"
    theirs.parent.mkdir()
    theirs.write_text("distributed_type: 'NO'\n")
    assert yc.find_default_config() == theirs  # Accelerate's file is used until we have one
    monkeypatch.setenv("ACCELERANDO_CONFIG_FILE", str(tmp_path / "mine.yaml"))
    assert yc.default_config_path() == tmp_path / "mine.yaml" and yc.find_default_config() is None


def test_renamed_fsdp_key_in_config_file_is_refused(tmp_path):
    from accelerando.config.yaml_config import load_config

    path = tmp_path / "old.yaml"
    path.write_text(
        "distributed_type: FSDP\nfsdp_config:\n  fsdp_backward_prefetch_policy: BACKWARD_PRE\n  fsdp_version: 2\n"
    )
    with pytest.raises(ValueError, match="renamed in Accelerate 1.0; use 'fsdp_backward_prefetch'"):
        load_config(path)
