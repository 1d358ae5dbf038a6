"""`accelerando config / env / test / estimate-memory` end to end, in subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

CLI = str(Path(sys.executable).with_name("accelerando"))
pytestmark = pytest.mark.timeout(120)


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERANDO_", "ACCELERATE_", "FSDP_"))}
    env.update(HF_HOME=str(tmp_path / "hf"), **extra)
    return env


def cli(
    args: list[str], env: dict[str, str], stdin: str | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CLI, *args], env=env, input=stdin, capture_output=True, text=True, timeout=90, cwd=cwd
    )


def test_config_default_update_questionnaire_and_env(tmp_path: Path) -> None:
    env = clean_env(tmp_path)
    first = cli(["config", "default", "--mixed_precision", "bf16"], env)
    assert first.returncode == 0, first.stderr
    path = tmp_path / "hf" / "accelerando" / "default_config.yaml"
    data = yaml.safe_load(path.read_text())
    assert data["mixed_precision"] == "bf16" and data["use_cpu"] is True and data["distributed_type"] == "NO"
    again = cli(["config", "default"], env)
    assert "already exists" in again.stdout and yaml.safe_load(path.read_text()) == data

    legacy = tmp_path / "legacy.yaml"
    legacy.write_text("distributed_type: MULTI_CPU\nfp16: true\nnum_processes: 2\n")
    upd = cli(["config", "update", "--config_file", str(legacy)], env)
    assert upd.returncode == 0, upd.stderr
    assert yaml.safe_load(legacy.read_text())["mixed_precision"] == "fp16"

    own = tmp_path / "answers.yaml"
    ans = cli(["config"], clean_env(tmp_path, ACCELERANDO_CONFIG_FILE=str(own)), stdin="2\n1\n2\nbf16\n\n")
    assert ans.returncode == 0, ans.stderr
    answers = yaml.safe_load(own.read_text())
    assert (answers["distributed_type"], answers["num_processes"], answers["mixed_precision"]) == (
        "MULTI_CPU",
        2,
        "bf16",
    )

    report = cli(["env"], env)
    assert report.returncode == 0, report.stderr
    for needle in (
        "accelerando version",
        "PyTorch version",
        "System RAM",
        str(path),
        "mixed_precision: bf16",
    ):
        assert needle in report.stdout


def test_accelerando_test_passes_on_two_cpu_processes(tmp_path: Path) -> None:
    config = tmp_path / "two.yaml"
    config.write_text("distributed_type: MULTI_CPU\nnum_processes: 2\nuse_cpu: true\n")
    proc = cli(["test", "--config_file", str(config)], clean_env(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "checks passed on 2 process(es)" in proc.stdout
    assert "Test is a success!" in proc.stdout


def test_estimate_memory_from_local_config_and_callable(tmp_path: Path) -> None:
    model_dir = tmp_path / "tiny"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(
        '{"model_type": "bert", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, '
        '"intermediate_size": 64, "vocab_size": 100}'
    )
    (tmp_path / "toy_model.py").write_text(
        "import torch\n\ndef build():\n    return torch.nn.Linear(1000, 1000)\n"
    )
    env = clean_env(tmp_path)
    proc = cli(["estimate-memory", str(model_dir), "--dtypes", "float32", "bfloat16"], env)
    assert proc.returncode == 0, proc.stderr
    assert "| float32  | ZeRO-3" in proc.stdout and "| bfloat16 | FSDP" in proc.stdout
    toy = cli(
        ["estimate-memory", "toy_model:build", "--dtypes", "float32", "--num_processes", "4"],
        env,
        cwd=tmp_path,
    )
    assert toy.returncode == 0, toy.stderr
    assert "1,001,000 parameters" in toy.stdout
    single = next(line for line in toy.stdout.splitlines() if "| single" in line)
    assert "15.27 MiB" in single  # 16 bytes per fp32 parameter with Adam
    bad = cli(["estimate-memory", "not_a_model"], env)
    assert bad.returncode == 2 and "module:callable" in bad.stderr
