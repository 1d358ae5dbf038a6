"""The collective helpers of the compatibility surface on 2 real gloo processes (one launch)."""

from __future__ import annotations

from pathlib import Path

from accelerando.testing import run_distributed

SCRIPTS = Path(__file__).parent / "scripts"


def test_copy_tensor_save_and_nested_padding_on_two_ranks(tmp_path: Path) -> None:
    proc = run_distributed(SCRIPTS / "compat_two_ranks.py", [str(tmp_path)], timeout=240)
    assert "compat checks passed on rank 0" in proc.stdout and "compat checks passed on rank 1" in proc.stdout
