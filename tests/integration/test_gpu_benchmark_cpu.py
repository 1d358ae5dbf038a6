"""benchmarks/gpu.py end to end on CPU at tiny sizes: the GPU machine runs the same code at full size."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu.py"
ROWS = {
    "mlp": r"4×Linear\(128\) MLP, fp32, AdamW, batch 32 \([\d.]+ ms/step plain\)",
    "accumulate": r"same, `accumulate` over 4 micro-batches \([\d.]+ ms/step plain\)",
    "transformer": r"2-layer 64-wide transformer, bf16 autocast, seq 32, batch 4 \([\d.]+ ms/step plain\)",
}


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_benchmark", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def test_gpu_benchmark_prints_every_row_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "gpu.md"
    cmd = [
        sys.executable,
        str(SCRIPT),
        "--cpu",
        "--small",
        "--jobs",
        "2",
        "--no-big-model",
        "--markdown",
        str(out),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert out.read_text() == proc.stdout
    assert "| case | plain PyTorch | Accelerate | accelerando | transformers |" in proc.stdout
    accelerate = importlib.util.find_spec("accelerate") is not None
    for name, label in ROWS.items():
        match = re.search(rf"^\| {label} \| (.*) \|$", proc.stdout, re.MULTILINE)
        assert match, f"row {name!r} missing:\n{proc.stdout}"
        plain, acc, ours, transformers = (cell.strip() for cell in match.group(1).split("|"))
        assert plain == "1.000" and float(ours) > 0 and transformers == "", match.group(0)
        assert float(acc) > 0 if accelerate else acc == "not installed", match.group(0)
    assert "big-model rows: skipped (--no-big-model)" in proc.stdout


def test_big_model_rows_follow_the_json_contract(tmp_path: Path) -> None:
    """gpu_big_model.py writes rows in seconds; each becomes one line of ratios to plain."""
    gpu = _load()
    rows = [
        {
            "case": "2.8B Llama to GPU",
            "plain": 1.0,
            "accelerate": 1.25,
            "accelerando": 0.8,
            "transformers": None,
        },
        {
            "case": "forward, disk offload",
            "plain": None,
            "accelerate": None,
            "accelerando": 2.5,
            "transformers": None,
        },
    ]
    text = gpu.render({"mlp": {"plain": [0.002], "accelerando": [0.002]}}, rows, "header", ["a note"], True)
    assert "| 2.8B Llama to GPU (plain 1.000 s) | 1.000 | 1.250 | 0.800 |  |" in text
    assert "| forward, disk offload |  |  | 2.500 s |  |" in text
    assert (
        "| 4×Linear(128) MLP, fp32, AdamW, batch 32 (2.00 ms/step plain) | 1.000 | not installed | 1.000 |  |"
        in text
    )
    assert text.rstrip().endswith("a note")
