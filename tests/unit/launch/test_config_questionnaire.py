"""`accelerando config` driven with scripted answers: each answer checked as given, only what applies asked."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from accelerando.commands import config as cmd
from accelerando.config.yaml_config import load_config, save_config


class Script:
    """Answers questions in order and records every prompt, so tests see what was asked."""

    def __init__(self, *answers: str) -> None:
        self._answers: Iterator[str] = iter(answers)
        self.prompts: list[str] = []

    def __call__(self, prompt: str) -> str:
        self.prompts.append(prompt)
        try:
            return next(self._answers)
        except StopIteration:
            raise AssertionError(f"unexpected question {prompt!r} (asked so far: {self.prompts})") from None

    def done(self) -> bool:
        return next(self._answers, None) is None


def run(*answers: str) -> tuple[dict[str, Any], Script]:
    script = Script(*answers)
    cfg = cmd.questionnaire(script)
    assert script.done(), "some answers were not asked for"
    return cfg, script


def test_one_process_asks_no_process_count_and_writes_a_quoted_no(tmp_path: Path) -> None:
    cfg, script = run("1", "yes", "", "")
    assert len(script.prompts) == 4  # kind, CPU only, precision, compile: nothing about processes
    assert not any("process" in p or "machine" in p for p in script.prompts)
    assert (cfg["distributed_type"], cfg["num_processes"], cfg["use_cpu"]) == ("NO", 1, True)
    path = save_config(cmd.check_launchable(cfg, tmp_path / "one.yaml"), tmp_path / "one.yaml")
    text = path.read_text()
    assert "distributed_type: 'NO'" in text and "mixed_precision: 'no'" in text
    assert yaml.safe_load(text)["distributed_type"] == "NO"
    loaded = load_config(path)
    assert loaded.values["num_processes"] == 1 and loaded.values["cpu"] is True


def test_an_unquoted_no_from_an_older_file_still_means_no_distribution(tmp_path: Path) -> None:
    path = tmp_path / "legacy.yaml"
    path.write_text("distributed_type: NO\nmixed_precision: no\nnum_processes: 1\n")
    assert yaml.safe_load(path.read_text())["distributed_type"] is False  # what YAML 1.1 does to it
    loaded = load_config(path)
    assert not any(k in loaded.values for k in ("cpu", "multi_gpu", "use_fsdp", "use_deepspeed"))
    assert loaded.values["mixed_precision"] == "no"
    from accelerando.commands.main import main

    assert main(["config", "update", "--config_file", str(path)]) == 0
    assert "distributed_type: 'NO'" in path.read_text() and "mixed_precision: 'no'" in path.read_text()


def test_bad_answers_are_asked_again_naming_the_value_and_what_is_accepted(
    capsys: pytest.CaptureFixture[str],
) -> None:
    cfg, script = run(
        "9", "2",  # kind: 9 unknown, then several CPU processes
        "-3", "2",  # machines
        "2", "0", "127.0.0.1 10.0.0.2", "10.0.0.1", "70000", "29511", "etcd", "static",  # rank, ip, port, rdzv
        "0", "3", "4",  # processes: at least 1, a multiple of 2 machines
        "fp64", "bf16",
        "warp_drive", "eager", "fastest", "max-autotune",
    )  # fmt: skip
    err = capsys.readouterr().err
    for message in [
        "'9' is not accepted: answer one of 1, 2, 3, 4, 5",
        "'-3' is not accepted: answer: num_machines=-3 must be at least 1",
        "'2' is not accepted: machine ranks are 0 to 1",
        "'127.0.0.1 10.0.0.2' is not accepted: give one host name or IP address",
        "'70000' is not accepted: answer: main_process_port=70000 must be between 1 and 65535",
        "'etcd' is not accepted: answer: rdzv_backend='etcd' is not one of c10d, static",
        "'0' is not accepted: answer: num_processes=0 must be at least 1",
        "'3' is not accepted: the total over 2 machines must be a multiple of 2",
        "'fp64' is not accepted: answer: mixed_precision='fp64' is not one of no, fp16, bf16, fp8",
        "'warp_drive' is not accepted: answer: dynamo_backend='warp_drive' is not one of no, eager",
        "'fastest' is not accepted: answer: dynamo_mode='fastest' is not one of default",
    ]:
        assert message in err, err
    assert cfg == {
        "compute_environment": "LOCAL_MACHINE", "distributed_type": "MULTI_CPU", "debug": False,
        "use_cpu": True, "num_machines": 2, "machine_rank": 0, "main_process_ip": "10.0.0.1",
        "main_process_port": 29511, "rdzv_backend": "static", "num_processes": 4, "mixed_precision": "bf16",
        "dynamo_config": {"dynamo_backend": "EAGER", "dynamo_mode": "max-autotune"},
    }  # fmt: skip


def test_fsdp_answers_go_through_the_plugins_own_checks(capsys: pytest.CaptureFixture[str]) -> None:
    cfg, _ = run(
        "4", "", "",  # FSDP, one machine, 2 processes
        "3", "1",  # version
        "EVERYTHING", "transformer_based_wrap", "Bert Layer", "BertLayer, BertEmbeddings",
        "LOCAL_STATE_DICT", "full_state_dict",
        "maybe", "yes", "no",  # offload, activation checkpointing
        "", "",
    )  # fmt: skip
    err = capsys.readouterr().err
    for message in [
        "'3' is not accepted: fsdp_version must be 1 or 2, got 3",
        "'EVERYTHING' is not accepted: answer one of TRANSFORMER_BASED_WRAP, SIZE_BASED_WRAP, NO_WRAP",
        "'Bert Layer' is not accepted: 'Bert Layer' not a class name",
        "'LOCAL_STATE_DICT' is not accepted: answer one of SHARDED_STATE_DICT, FULL_STATE_DICT",
        "'maybe' is not accepted: answer yes or no",
    ]:
        assert message in err, err
    assert cfg["fsdp_config"] == {
        "fsdp_version": 1, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_transformer_layer_cls_to_wrap": "BertLayer,BertEmbeddings", "fsdp_state_dict_type": "FULL_STATE_DICT",
        "fsdp_offload_params": True, "fsdp_activation_checkpointing": False,
    }  # fmt: skip
    assert cfg["num_processes"] == 2 and "dynamo_config" not in cfg


def test_size_based_wrap_asks_its_threshold_and_unregistered_backends_are_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from accelerando.commands import launch

    monkeypatch.setattr(launch, "compile_backends", lambda: ["eager", "inductor"])
    cfg, script = run("4", "", "", "", "SIZE_BASED_WRAP", "-5", "1000", "", "", "", "", "tvm", "inductor", "")
    assert cfg["fsdp_config"]["fsdp_min_num_params"] == 1000
    assert not any("layer classes" in p for p in script.prompts)
    err = capsys.readouterr().err
    assert "fsdp_min_num_params=-5 must be at least 0" in err
    assert "torch has no compile backend 'tvm' here; registered: eager, inductor" in err


def test_five_bad_answers_stop_with_an_error() -> None:
    with pytest.raises(ValueError, match="no valid answer for 'choice' after 5 tries"):
        cmd.questionnaire(Script("0", "6", "7", "8", "x"))


def test_the_command_writes_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from accelerando.commands.main import main

    monkeypatch.setattr("sys.stdin", io.StringIO("3\n\n4\nfp16\n\n"))
    target = tmp_path / "gpu.yaml"
    assert main(["config", "--config_file", str(target)]) == 0
    written = yaml.safe_load(target.read_text())
    assert (written["distributed_type"], written["num_processes"], written["mixed_precision"]) == (
        "MULTI_GPU",
        4,
        "fp16",
    )


def test_deepspeed_answers_write_accelerates_section_and_launch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg, _ = run(
        "5", "", "",  # DeepSpeed, one machine, 2 processes
        "no", "4", "3",  # no JSON file; stage 4 refused, then 3
        "cpu", "nvme", "/nvme/p",  # offloads
        "2", "yes", "1.0",  # accumulation, clipping
        "no", "yes",  # zero3_init_flag, 16-bit save
        "bf16", "",
    )  # fmt: skip
    assert "'4' is not accepted: answer: zero_stage=4 must be between 0 and 3" in capsys.readouterr().err
    assert cfg["distributed_type"] == "DEEPSPEED" and cfg["deepspeed_config"] == {
        "zero_stage": 3, "offload_optimizer_device": "cpu", "offload_param_device": "nvme",
        "offload_param_nvme_path": "/nvme/p", "gradient_accumulation_steps": 2, "gradient_clipping": 1.0,
        "zero3_init_flag": False, "zero3_save_16bit_model": True,
    }  # fmt: skip
    path = save_config(cmd.check_launchable(cfg, tmp_path / "ds.yaml"), tmp_path / "ds.yaml")
    loaded = load_config(path).values
    assert (
        loaded["use_deepspeed"] is True and loaded["zero_stage"] == 3 and loaded["gradient_clipping"] == 1.0
    )

    ds_json = tmp_path / "ds.json"
    ds_json.write_text('{"zero_optimization": {"stage": 3}}')
    cfg, script = run("5", "", "", "yes", str(tmp_path / "nope.json"), str(ds_json), "yes", "no", "", "")
    assert "cannot read the DeepSpeed config file" in capsys.readouterr().err
    assert cfg["deepspeed_config"] == {
        "deepspeed_config_file": str(ds_json), "zero3_init_flag": True, "zero3_save_16bit_model": False,
    }  # fmt: skip
    assert not any("ZeRO stage" in p for p in script.prompts)  # the file says it
    cmd.check_launchable(cfg, tmp_path / "ds2.yaml")
