"""The test helper itself: a hung job is a failure, and it leaves no process behind."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from accelerando.testing import run_distributed


def _running(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(entry))
        except (OSError, ValueError):
            continue
    return found


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_a_hung_job_times_out_and_every_rank_is_killed(tmp_path: Path) -> None:
    script = tmp_path / "hangs_forever.py"
    script.write_text("import time\nwhile True:\n    time.sleep(1)\n")
    with pytest.raises(AssertionError, match="timed out after 15s"):
        run_distributed(script, timeout=15)
    deadline = time.monotonic() + 5
    while _running(str(script)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _running(str(script)) == []
