"""benchmarks/gpu_big_model.py at its smallest size on the CPU: the rows the GPU table is made from."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
KEYS = {"case", "plain", "accelerate", "accelerando", "transformers", "unit"}


def test_small_cpu_run_writes_every_row(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_big_model.py"), "--json", str(out), "--small", "--cpu"],
        capture_output=True, text=True, env=env, timeout=280, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert [row["case"].split(",")[0] for row in rows] == [
        "time-to-ready", "time-to-ready", "forward", "forward"
    ]  # fmt: skip
    has_accelerate = importlib.util.find_spec("accelerate") is not None
    for i, row in enumerate(rows):
        assert set(row) == KEYS and row["unit"] == "s"
        for lib in ("accelerando", "transformers") + (("accelerate",) if has_accelerate else ()):
            assert isinstance(row[lib], float) and row[lib] > 0, (row["case"], lib)
        assert (row["plain"] is not None) == (i == 0)  # plain only loads: it has no offload path
    assert "cpu+disk map" in rows[1]["case"] and "on disk" in rows[1]["case"]
    assert "| time-to-ready, all on cpu |" in proc.stdout
    assert "accelerando: offloaded logits equal the all-on-device logits" in proc.stdout
    assert "differ" not in proc.stdout.lower()  # every contender loaded the same bits as plain
