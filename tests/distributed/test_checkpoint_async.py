"""save_state(async_save=True) on 2 ranks: same bytes as a synchronous save, exact resume, errors
raised at the next call, end_training waits (the checks live in scripts/ckpt_async.py, one launch)."""

from __future__ import annotations

from pathlib import Path

from accelerando.testing import run_distributed

SCRIPT = Path(__file__).parent / "scripts" / "ckpt_async.py"


def test_async_save_two_ranks(tmp_path: Path) -> None:
    proc = run_distributed(SCRIPT, [str(tmp_path)], timeout=150)
    assert "ASYNC ok rank 0" in proc.stdout and "ASYNC ok rank 1" in proc.stdout
