"""benchmarks/fp8/run.py's presets and table, without training (the CPU smoke run itself takes ~15 s:
`python benchmarks/fp8/run.py --smoke`)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
import torch

SCRIPT = Path(__file__).parents[3] / "benchmarks" / "fp8" / "run.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fp8_bench", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_presets_fill_what_is_not_given_and_a_given_flag_wins() -> None:
    bench = _load()
    gpu = bench.parse_args(["--gpu", "--steps", "250"])
    assert (gpu.dim, gpu.depth, gpu.seq, gpu.batch, gpu.steps, gpu.compile) == (2048, 20, 1024, 4, 250, True)
    with torch.device("meta"):  # no memory: only the parameter count
        model = bench.Transformer(gpu.dim, gpu.depth, gpu.heads)
    assert sum(p.numel() for p in model.parameters()) >= 1.0e9
    smoke = bench.parse_args(["--smoke"])
    assert (smoke.dim, smoke.steps, smoke.compile) == (64, 3, False)
    plain = bench.parse_args([])
    assert (plain.dim, plain.steps) == (64, 10)


def test_bad_combinations_are_refused_naming_them(capsys: pytest.CaptureFixture[str]) -> None:
    bench = _load()
    with pytest.raises(SystemExit):
        bench.parse_args(["--smoke", "--gpu"])
    assert "--smoke and --gpu" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.parse_args(["--steps", "5", "--warmup", "5"])
    assert "--warmup 5 must be below --steps 5" in capsys.readouterr().err


def test_table_compares_with_bf16_and_states_the_gpu_target() -> None:
    bench = _load()
    args = bench.parse_args(["--gpu"])
    row = {
        "step_ms": 100.0,
        "first_s": 30.0,
        "peak_mib": 1000.0,
        "final_loss": 0.5,
        "device": "cuda:0",
        "params": 1.007e9,
    }
    fp8 = {**row, "step_ms": 70.0, "final_loss": 0.502}
    table = bench._table(
        [("bf16", "(baseline)", row, ""), ("torchao tensorwise", "equal", fp8, ""), ("Transformer Engine", "skipped", None, "needs x")],
        args,
    )  # fmt: skip
    assert "| torchao tensorwise | equal | 70.0 | 1.43x |" in table
    assert "| Transformer Engine | skipped: needs x |" in table
    assert "1.43x, 0.40% -> met" in table
