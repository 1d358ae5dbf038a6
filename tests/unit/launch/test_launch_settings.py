"""Precedence and validation of `accelerando launch` settings, as pure functions (no processes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from accelerando.config.yaml_config import ConfigFile
from accelerando.launch.settings import Detected, child_exports, parse_rdzv_conf, report, resolve

CPU = Detected(device_type="cpu", device_count=0, cpu_cores=8)
GPU4 = Detected(device_type="cuda", device_count=4, cpu_cores=32)


def cfg(**values: object) -> ConfigFile:
    return ConfigFile(path=Path("/etc/acc.yaml"), values=dict(values), keys={k: k for k in values})


def test_flag_beats_environment_beats_file_beats_default() -> None:
    r = resolve(
        {"num_processes": 2},
        {"ACCELERANDO_NUM_PROCESSES": "3", "ACCELERANDO_MIXED_PRECISION": "bf16"},
        cfg(num_processes=4, mixed_precision="fp16", dynamo_backend="eager"),
        CPU,
    )
    assert (r["num_processes"], r.sources["num_processes"]) == (2, "--num_processes")
    assert (r["mixed_precision"], r.sources["mixed_precision"]) == ("bf16", "env ACCELERANDO_MIXED_PRECISION")
    assert r["dynamo_backend"] == "eager" and r.sources["dynamo_backend"].startswith("config /etc/acc.yaml")
    assert (r["max_restarts"], r.sources["max_restarts"]) == (0, "default")


def test_accelerate_prefix_is_an_alias_and_ours_wins() -> None:
    r = resolve({}, {"ACCELERATE_MIXED_PRECISION": "fp16"}, None, CPU)
    assert (r["mixed_precision"], r.sources["mixed_precision"]) == ("fp16", "env ACCELERATE_MIXED_PRECISION")
    r = resolve({}, {"ACCELERATE_MIXED_PRECISION": "fp16", "ACCELERANDO_MIXED_PRECISION": "bf16"}, None, CPU)
    assert r["mixed_precision"] == "bf16"


def test_cpu_detected_without_accelerator_and_counts_default() -> None:
    r = resolve({}, {}, None, CPU)
    assert r["cpu"] is True and r.sources["cpu"] == "detected: no accelerator"
    assert (r["num_processes"], r["nproc_per_node"]) == (1, 1)
    assert r["num_cpu_threads_per_process"] == 8
    g = resolve({}, {}, None, GPU4)
    assert g["cpu"] is None and g["num_processes"] == 4 and g["num_cpu_threads_per_process"] == 1


def test_multi_gpu_with_accelerate_use_cpu_runs_on_cpu() -> None:
    r = resolve({"multi_gpu": True, "num_processes": 2}, {"ACCELERATE_USE_CPU": "1"}, None, GPU4)
    assert r["cpu"] is True and r.sources["cpu"] == "env ACCELERATE_USE_CPU"


def test_cpu_and_multi_gpu_flags_conflict() -> None:
    with pytest.raises(ValueError, match="exclude each other"):
        resolve({"cpu": True, "multi_gpu": True}, {}, None, GPU4)


def test_num_processes_is_a_total_and_per_node_may_differ() -> None:
    base = {"num_machines": 2, "main_process_ip": "10.0.0.1"}
    r = resolve({**base, "num_processes": 8}, {}, None, GPU4)
    assert r["nproc_per_node"] == 4 and r["main_process_port"] == 29500
    with pytest.raises(
        ValueError, match="multiple of it; for machines with different counts pass --nproc_per_node"
    ):
        resolve({**base, "num_processes": 5}, {}, None, GPU4)
    r = resolve({**base, "nproc_per_node": 3, "machine_rank": 1}, {}, None, GPU4)
    assert r["nproc_per_node"] == 3 and r.sources["num_processes"].startswith("derived")


def test_multi_node_needs_main_ip_and_valid_rank() -> None:
    with pytest.raises(ValueError, match="needs --main_process_ip"):
        resolve({"num_machines": 2, "num_processes": 2}, {}, None, CPU)
    with pytest.raises(ValueError, match=r"machine_rank=2 .* must be in \[0, 1\]"):
        resolve({"num_machines": 2, "machine_rank": 2}, {}, None, CPU)


def test_single_machine_uses_private_c10d_and_avoids_busy_port() -> None:
    with pytest.warns(UserWarning, match="in use"):
        r = resolve(
            {"main_process_port": 1234}, {}, cfg(rdzv_backend="static"), CPU,
            port_is_free=lambda p: False, free_port=lambda: 5555,
        )  # fmt: skip
    assert r["main_process_port"] == 5555 and r["rdzv_backend"] == "c10d"


def test_bad_values_name_the_value_and_its_source() -> None:
    with pytest.raises(
        ValueError, match=r"env ACCELERANDO_MIXED_PRECISION: mixed_precision='fp64' is not one of"
    ):
        resolve({}, {"ACCELERANDO_MIXED_PRECISION": "fp64"}, None, CPU)
    with pytest.raises(ValueError, match=r"config /etc/acc.yaml \(num_processes\): 'two' is not a valid int"):
        resolve({}, {}, cfg(num_processes="two"), CPU)
    with pytest.raises(ValueError, match="gpu_ids"):
        resolve({"gpu_ids": "0,x"}, {}, None, GPU4)
    with pytest.raises(ValueError, match="does not launch TPU"):
        resolve({"tpu": True}, {}, None, CPU)
    with pytest.raises(ValueError, match="not key=value"):
        parse_rdzv_conf("join_timeout=5,oops")
    assert parse_rdzv_conf(" join_timeout=5 , read_timeout=2") == {"join_timeout": "5", "read_timeout": "2"}


def test_yaml_no_is_read_as_the_string_no() -> None:
    r = resolve({}, {}, cfg(mixed_precision=False), CPU)
    assert r["mixed_precision"] == "no"


def test_exports_only_what_was_set_with_accelerate_names() -> None:
    r = resolve(
        {"use_fsdp": True, "fsdp_version": 2, "fsdp_transformer_layer_cls_to_wrap": "Block",
         "gradient_accumulation_steps": 4, "gpu_ids": "0,1", "num_processes": 2},
        {}, None, GPU4,
    )  # fmt: skip
    out = child_exports(r, "cuda")
    assert out["ACCELERANDO_USE_FSDP"] == "true" and out["FSDP_VERSION"] == "2"
    assert out["FSDP_TRANSFORMER_CLS_TO_WRAP"] == "Block"
    assert out["ACCELERANDO_GRADIENT_ACCUMULATION_STEPS"] == "4"
    assert out["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert "ACCELERANDO_MIXED_PRECISION" not in out and "FSDP_OFFLOAD_PARAMS" not in out


def test_report_lists_values_with_sources() -> None:
    text = report(resolve({"num_processes": 2}, {"ACCELERANDO_MIXED_PRECISION": "bf16"}, None, CPU))
    assert "num_processes" in text and "[--num_processes]" in text
    assert "[env ACCELERANDO_MIXED_PRECISION]" in text and "bf16" in text
