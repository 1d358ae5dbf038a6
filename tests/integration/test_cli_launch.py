"""`accelerando launch` end to end: the real console script in a subprocess, gloo ranks on CPU.

Every run has a hard timeout; the environment is cleaned of launcher variables and the per-user
config location points at a temporary folder, so the machine's own files never leak in.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from accelerando.testing import free_port

SCRIPTS = Path(__file__).parent / "scripts"
CLI = str(Path(sys.executable).with_name("accelerando"))
pytestmark = pytest.mark.timeout(120)


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ACCELERANDO_", "ACCELERATE_", "FSDP_", "TORCHELASTIC_", "PARALLELISM_CONFIG_"))
        and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS")
    }
    env["HF_HOME"] = str(tmp_path / "hf")
    env.update(extra)
    return env


def run_cli(
    args: list[str], env: dict[str, str], timeout: float = 90, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [CLI, *args], env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd or SCRIPTS
        )
    except subprocess.TimeoutExpired as err:
        raise AssertionError(
            f"accelerando {' '.join(args)} timed out after {timeout}s\n{err.stdout}\n{err.stderr}"
        ) from None


def reports(stdout: str) -> list[dict]:
    return sorted((json.loads(line[7:]) for line in stdout.splitlines() if line.startswith("REPORT ")),
                  key=lambda r: r["rank"])  # fmt: skip


ACCELERATE_CONFIG = """\
compute_environment: LOCAL_MACHINE
debug: false
distributed_type: MULTI_CPU
downcast_bf16: 'no'
dynamo_config:
  dynamo_backend: EAGER
machine_rank: 0
main_training_function: main
mixed_precision: fp16
num_machines: 1
num_processes: 1
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: true
"""


def test_accelerate_config_file_and_precedence(tmp_path: Path) -> None:
    """file < env (ACCELERATE_ alias) < flag, one launch of 2 ranks; the printout names each source."""
    config = tmp_path / "accelerate_config.yaml"
    config.write_text(ACCELERATE_CONFIG)
    env = clean_env(tmp_path, ACCELERATE_MIXED_PRECISION="bf16", ACCELERANDO_NUM_PROCESSES="3")
    proc = run_cli(
        ["launch", "--config_file", str(config), "--num-processes", "2", "--gradient_accumulation_steps", "4",
         "cli_report_env.py", "--lr", "0.1"],
        env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    ranks = reports(proc.stdout)
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["world"] == 2 and r["sum"] == 2.0 for r in ranks)
    first = ranks[0]
    assert first["ACCELERANDO_MIXED_PRECISION"] == "bf16"  # env beats the file's fp16
    assert first["ACCELERANDO_DYNAMO_BACKEND"] == "eager"  # only in the file
    assert first["ACCELERANDO_USE_CPU"] == "true" and first["ACCELERANDO_GRADIENT_ACCUMULATION_STEPS"] == "4"
    assert first["argv"] == ["--lr", "0.1"]
    err = proc.stderr
    assert "[--num_processes]" in err and "[env ACCELERATE_MIXED_PRECISION]" in err
    assert f"[config {config} (dynamo_config.dynamo_backend)]" in err
    assert err.count("resolved configuration") == 1


def launcher_leftovers(tmp: Path) -> list[str]:
    """What the launcher (or torch's agent under it) left in the temporary directory."""
    return sorted(
        p.name for p in tmp.iterdir() if p.name.startswith(("accelerando-launch-", "torchelastic_"))
    )


def test_cpu_two_ranks_module_target_without_config(tmp_path: Path) -> None:
    """`--cpu --num_processes 2 -m pkg`: two gloo ranks, no config file anywhere, quiet."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = clean_env(tmp_path, TMPDIR=str(tmp))
    proc = run_cli(["launch", "-q", "--cpu", "--num_processes", "2", "-m", "pkg_target"], env)
    assert proc.returncode == 0, proc.stderr
    assert launcher_leftovers(tmp) == []
    ranks = reports(proc.stdout)
    assert [(r["rank"], r["world"], r["ACCELERANDO_USE_CPU"]) for r in ranks] == [
        (0, 2, "true"),
        (1, 2, "true"),
    ]
    assert "resolved configuration" not in proc.stderr


def test_failing_rank_ends_job_with_its_traceback_first(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    start = time.monotonic()
    proc = run_cli(
        ["launch", "-q", "--cpu", "--num_processes", "2", "cli_fail.py"], clean_env(tmp_path, TMPDIR=str(tmp))
    )
    elapsed = time.monotonic() - start
    assert proc.returncode == 1
    assert launcher_leftovers(tmp) == []
    assert elapsed < 60, f"the surviving rank was not stopped ({elapsed:.0f}s)"
    report = proc.stderr[proc.stderr.index("accelerando launch: cli_fail.py failed") :]
    assert "first failure: rank 1" in report
    assert (
        report.index("ValueError: boom from rank 1") < report.index("also: rank 0")
        if "also:" in report
        else True
    )
    assert "ValueError: boom from rank 1" in report and "runpy" not in proc.stderr
    # printed once (by the worker, with its frames), not again in the report
    assert proc.stderr.count('File "cli_fail.py", line 11, in explode') == 1, proc.stderr
    assert "ChildFailedError" not in proc.stderr  # torch's box is replaced by our report


def test_max_restarts_recovers_from_a_first_attempt_failure(tmp_path: Path) -> None:
    proc = run_cli(
        ["launch", "-q", "--cpu", "--num_processes", "2", "--max_restarts", "1", "cli_flaky.py"],
        clean_env(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr
    assert sorted(line for line in proc.stdout.splitlines() if line.startswith("FLAKY")) == [
        "FLAKY rank 0 attempt 1 sum 2.0",
        "FLAKY rank 1 attempt 1 sum 2.0",
    ]
    assert "will restart worker group" in proc.stderr


def _node(rank: int, nproc: int, port: int, tmp_path: Path) -> subprocess.Popen[str]:
    args = ["launch", "-q", "--cpu", "--num_machines", "2", "--machine_rank", str(rank), "--nproc_per_node",
            str(nproc), "--main_process_ip", "127.0.0.1", "--main_process_port", str(port),
            "--rdzv_conf", "join_timeout=60", "cli_report_env.py"]  # fmt: skip
    return subprocess.Popen([CLI, *args], env=clean_env(tmp_path), cwd=SCRIPTS, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip


def test_two_nodes_on_loopback_with_different_process_counts(tmp_path: Path) -> None:
    port = free_port()
    nodes = [_node(1, 1, port, tmp_path), _node(0, 2, port, tmp_path)]  # node 1 first: it waits for node 0
    outputs = []
    try:
        for node in nodes:
            out, err = node.communicate(timeout=90)
            outputs.append((node.returncode, out, err))
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
    for code, _, err in outputs:
        assert code == 0, err
    ranks = reports(outputs[0][1] + outputs[1][1])
    assert sorted(r["rank"] for r in ranks) == [0, 1, 2] and all(
        r["world"] == 3 and r["sum"] == 3 for r in ranks
    )
    assert sorted(r["LOCAL_WORLD_SIZE"] for r in ranks) == ["1", "2", "2"]


def test_unreachable_main_node_fails_clearly_within_timeout(tmp_path: Path) -> None:
    start = time.monotonic()
    proc = run_cli(
        ["launch", "--cpu", "--num_machines", "2", "--machine_rank", "1", "--num_processes", "2",
         "--main_process_ip", "127.0.0.1", "--main_process_port", str(free_port()), "--rdzv_conf", "read_timeout=2",
         "cli_report_env.py"],
        clean_env(tmp_path),
    )  # fmt: skip
    assert proc.returncode == 1 and time.monotonic() - start < 30
    assert "machine 1 of 2 could not join the rendezvous at 127.0.0.1:" in proc.stderr
    assert "read_timeout" in proc.stderr


def test_bad_flag_value_is_a_clear_error(tmp_path: Path) -> None:
    proc = run_cli(
        ["launch", "--mixed_precision", "fp64", "cli_report_env.py"], clean_env(tmp_path), timeout=60
    )
    assert proc.returncode == 2 and "fp64" in proc.stderr and "no, fp16, bf16, fp8" in proc.stderr
    proc = run_cli(["launch", "missing_script.py"], clean_env(tmp_path), timeout=60)
    assert proc.returncode == 2 and "missing_script.py" in proc.stderr


def test_notebook_and_debug_launcher_reraise_in_caller(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "cli_notebook.py")], env=clean_env(tmp_path), capture_output=True, text=True,
        timeout=90, cwd=SCRIPTS,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert sorted(line for line in proc.stdout.splitlines() if line.startswith("NB")) == [
        "NB rank 0 sum 6.0 cpu true",
        "NB rank 1 sum 6.0 cpu true",
    ]
    assert (
        sum(line.startswith("ACC rank") and "MULTI_CPU sum 2.0" in line for line in proc.stdout.splitlines())
        == 2
    )
    assert "CAUGHT Boom('rank one exploded') on-rank-1=True" in proc.stdout


def test_cpu_affinity_and_threads_reach_each_process(tmp_path: Path) -> None:
    """--enable_cpu_affinity pins each local rank to its own share; OMP_NUM_THREADS reaches torch."""
    proc = run_cli(
        ["launch", "-q", "--cpu", "--num_processes", "2", "--enable_cpu_affinity",
         "--num_cpu_threads_per_process", "1", "cli_pinning.py"],
        clean_env(tmp_path),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    ranks = sorted(
        (json.loads(line[8:]) for line in proc.stdout.splitlines() if line.startswith("PINNING ")),
        key=lambda r: r["local_rank"],
    )
    allowed = sorted(os.sched_getaffinity(0))
    shares = [r["cores"] for r in ranks]
    assert len(shares) == 2 and all(r["threads"] == 1 for r in ranks)
    if len(allowed) >= 2:
        half = len(allowed) // 2
        assert shares == [allowed[:half], allowed[half:]]
    else:
        assert shares == [allowed, allowed]
