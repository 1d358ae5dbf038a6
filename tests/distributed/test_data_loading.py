"""Data loading on 2 real gloo processes: every mode against a brute-force reference, then resume."""

from __future__ import annotations

import time
from pathlib import Path

from accelerando.testing import run_distributed

SCRIPTS = Path(__file__).parent / "scripts"


def test_every_mode_and_exact_resume_in_fresh_processes(tmp_path: Path) -> None:
    first = run_distributed(SCRIPTS / "data_modes.py", args=[str(tmp_path)], timeout=240)
    assert "data modes passed" in first.stdout
    assert len(list(tmp_path.glob("*.pt"))) == 20  # 5 modes x (plain, stateful) x 2 ranks
    second = run_distributed(SCRIPTS / "data_resume.py", args=[str(tmp_path)], timeout=240)
    assert "data resume passed (10 loaders per rank)" in second.stdout


def test_dispatch_crash_on_rank0_ends_every_rank_with_its_error() -> None:
    start = time.monotonic()
    proc = run_distributed(SCRIPTS / "data_crash.py", expect_success=False, timeout=120)
    assert time.monotonic() - start < 30
    assert "sample 150 is corrupt on purpose" in proc.stderr
    assert "[accelerando] rank 0 failed" in proc.stderr


def _shm_files() -> set[str]:
    return {p.name for p in Path("/dev/shm").glob("accelerando-*")} if Path("/dev/shm").is_dir() else set()


def test_dispatch_killed_rank_ends_the_job_and_leaves_no_shared_memory_files() -> None:
    before = _shm_files()
    start = time.monotonic()
    run_distributed(SCRIPTS / "data_killed.py", expect_success=False, timeout=120)
    assert time.monotonic() - start < 30
    assert _shm_files() <= before
