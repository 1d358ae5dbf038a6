"""The resume contract on 2 processes: stop mid-epoch, resume in a fresh process, end bit-for-bit equal.

Three launches cover every variant (plain, accumulation 2, fp16 + GradScaler) and the
2 -> 1 -> 2 process round trip; see scripts/ckpt_resume.py.
"""

from __future__ import annotations

from pathlib import Path

from accelerando.testing import run_distributed

SCRIPT = Path(__file__).parent / "scripts" / "ckpt_resume.py"


def test_resume_is_exact(tmp_path: Path) -> None:
    run_distributed(SCRIPT, ["ab", str(tmp_path)], timeout=240)
    run_distributed(SCRIPT, ["one", str(tmp_path)], nproc=1, timeout=120)
    proc = run_distributed(SCRIPT, ["c", str(tmp_path)], timeout=240)
    assert 'RESUME {"plain": "equal", "accum": "equal", "fp16": "equal"}' in proc.stdout
