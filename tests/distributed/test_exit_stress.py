"""Every launched script exits cleanly under load: exit 0, no abort, no C++ trace (issue 17).

In CI each way of ending a script (`scripts/core_exit_modes.py`) runs once with a CPU hog beside
it. By hand, the same test repeats every launched script of this folder that is expected to
succeed (set `ACCELERANDO_EXIT_STRESS_ALL=1`) for `ACCELERANDO_EXIT_STRESS_ROUNDS` rounds:

    ACCELERANDO_EXIT_STRESS_ROUNDS=20 ACCELERANDO_EXIT_STRESS_ALL=1 \\
        .venv/bin/python -m pytest -s tests/distributed/test_exit_stress.py

It prints `EXIT STRESS runs=... failed=...` and fails with every failed run's output.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from accelerando.testing import run_distributed

SCRIPTS = Path(__file__).parent / "scripts"
EXIT_MODES = ("noprep", "reset", "user_group", "end", "again")

# (script, args with {work} for a fresh folder per round, ranks, extra environment), in order:
# a later step may read what an earlier one of the same round wrote.
ALL_LAUNCHES: list[tuple[str, tuple[str, ...], int, dict[str, str]]] = [
    ("core_ddp.py", (), 2, {}),
    ("data_modes.py", ("{work}",), 2, {}),
    ("data_resume.py", ("{work}",), 2, {}),
    ("ckpt_failures.py", ("raise", "{work}"), 2, {}),
    ("ckpt_async.py", ("{work}",), 2, {}),
    ("ckpt_resume.py", ("ab", "{work}"), 2, {}),
    ("ckpt_resume.py", ("one", "{work}"), 1, {}),
    ("ckpt_resume.py", ("c", "{work}"), 2, {}),
    ("fsdp_train.py", (), 2, {}),
    ("fsdp_checkpoint.py", ("{work}", "main"), 2, {"MALLOC_MMAP_THRESHOLD_": "65536"}),
    ("pipeline_pippy.py", (), 2, {}),
]


@pytest.fixture
def cpu_hog() -> Iterator[None]:
    """One process spinning on a core for the test's duration, as other work on a shared machine does."""
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        hog.kill()
        hog.wait()


def _launches(work: Path) -> list[tuple[str, list[str], int, dict[str, str]]]:
    runs = [("core_exit_modes.py", [mode], 2, {}) for mode in EXIT_MODES]
    shared_store = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "0"}  # torchrun's default
    runs.append(("core_exit_modes.py", ["again"], 2, shared_store))
    if os.environ.get("ACCELERANDO_EXIT_STRESS_ALL") == "1":
        runs += [(s, [a.format(work=work) for a in args], n, env) for s, args, n, env in ALL_LAUNCHES]
    return runs


def _prepare_round(work: Path) -> None:
    """fsdp_checkpoint.py's launch loads what its single-process `save1` phase wrote."""
    if os.environ.get("ACCELERANDO_EXIT_STRESS_ALL") == "1":
        subprocess.run(
            [sys.executable, str(SCRIPTS / "fsdp_checkpoint.py"), str(work), "save1"],
            check=True,
            capture_output=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            timeout=240,
        )


def test_every_launched_script_exits_cleanly_under_load(cpu_hog: None, tmp_path: Path) -> None:
    rounds = int(os.environ.get("ACCELERANDO_EXIT_STRESS_ROUNDS", "1"))
    runs, failures = 0, []
    for round_index in range(rounds):
        work = tmp_path / f"round{round_index}"
        work.mkdir()
        _prepare_round(work)
        for script, args, nproc, env in _launches(work):
            runs += 1
            try:
                proc = run_distributed(SCRIPTS / script, args, nproc=nproc, env=env, timeout=300)
                if script == "core_exit_modes.py" and proc.stdout.count("EXIT group_alive=False") != nproc:
                    raise AssertionError(f"group alive at exit\n{proc.stdout}")
                print(f"EXIT STRESS run {runs} ok: round {round_index} {script} {args}", flush=True)
            except AssertionError as failure:
                failures.append(f"round {round_index} {script} {args}: {failure}")
                print(f"EXIT STRESS run {runs} FAILED: {failures[-1][:2000]}", flush=True)
    print(f"EXIT STRESS runs={runs} failed={len(failures)}")
    assert not failures, "\n\n".join(failures)
