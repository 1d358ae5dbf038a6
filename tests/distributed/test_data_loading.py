"""Data loading on 2 real gloo processes: every mode against a brute-force reference, then resume."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from accelerando.testing import free_port, run_distributed

SCRIPTS = Path(__file__).parent / "scripts"


def test_every_mode_and_exact_resume_in_fresh_processes(tmp_path: Path) -> None:
    first = run_distributed(SCRIPTS / "data_modes.py", args=[str(tmp_path)], timeout=240)
    assert "data modes passed" in first.stdout
    assert len(list(tmp_path.glob("*.pt"))) == 28  # 7 modes x (plain, stateful) x 2 ranks
    second = run_distributed(SCRIPTS / "data_resume.py", args=[str(tmp_path)], timeout=240)
    assert "data resume passed (14 loaders per rank)" in second.stdout


# Whole launches, start-up of both ranks included: 10-20 s idle, up to ~50 s beside a CPU hog on 2
# cores (30 s failed there); a rank left waiting would hold the job to the process-group timeout.
ENDS_WITHIN = 75


def test_dispatch_crash_on_rank0_ends_every_rank_with_its_error() -> None:
    start = time.monotonic()
    proc = run_distributed(SCRIPTS / "data_crash.py", expect_success=False, timeout=120)
    assert time.monotonic() - start < ENDS_WITHIN
    assert "sample 150 is corrupt on purpose" in proc.stderr
    assert "[accelerando] rank 0 failed" in proc.stderr


def _shm_files() -> set[str]:
    return {p.name for p in Path("/dev/shm").glob("accelerando-*")} if Path("/dev/shm").is_dir() else set()


def test_dispatch_killed_rank_ends_the_job_and_leaves_no_shared_memory_files() -> None:
    before = _shm_files()
    start = time.monotonic()
    run_distributed(SCRIPTS / "data_killed.py", expect_success=False, timeout=120)
    assert time.monotonic() - start < ENDS_WITHIN
    assert _shm_files() <= before


def _start_pair(victim: int, route: str) -> list[subprocess.Popen[str]]:
    """Two ranks as plain processes, as `srun` or `mpirun` start them: no agent stops the survivor."""
    port, procs = free_port(), []
    for rank in range(2):
        env = {
            **os.environ,
            **{"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"},
            **{"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"},
        }
        script = [sys.executable, str(SCRIPTS / "data_dead_peer.py"), str(victim), route]
        procs.append(
            subprocess.Popen(script, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    return procs


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the ring is Linux only")
def test_dispatch_peer_killed_mid_epoch_makes_the_other_rank_raise_naming_it() -> None:
    """A dead receiver makes rank 0 raise within 10 s naming it, and a dead rank 0 its receiver,
    over the shared-memory ring, reading rank 0's memory, and over gloo (the six pairs run at once)."""
    cases = [(victim, route) for victim in (1, 0) for route in ("ring", "cross", "gloo")]
    pairs = {case: _start_pair(*case) for case in cases}
    for (victim, route), procs in pairs.items():
        outs = [p.communicate(timeout=120) for p in procs]
        died = [line for line in outs[victim][0].splitlines() if line.startswith("DYING")]
        raised = [line for line in outs[1 - victim][0].splitlines() if line.startswith("RAISED")]
        assert died and raised and procs[1 - victim].returncode == 3, (victim, route, outs)
        assert float(raised[0].split()[1]) - float(died[0].split()[1]) < 10, (victim, route, raised, died)
        assert f"rank {victim}" in raised[0], (victim, route, raised)
