"""Step time of plain PyTorch, Accelerate and accelerando on one device, side by side (issue 20's table).

Every (case, framework) cell runs in a fresh process; repeats are interleaved (each round runs every
cell once before the next round starts, so drift hits all alike) and the table shows the median as a
ratio to plain PyTorch. The device is synchronised only around the timed steps, never inside them.
Big-model loading rows come from `benchmarks/gpu_big_model.py --json FILE` when that script exists.

    PYTHONPATH=src python benchmarks/gpu.py                  # CUDA, full sizes (H200: about 3 minutes)
    PYTHONPATH=src python benchmarks/gpu.py --cpu --small    # tiny sizes on CPU: the CI smoke run
    ... --markdown benchmarks/results/gpu.md                 # also write the tables there
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BIG_MODEL_SCRIPT = Path(__file__).resolve().parent / "gpu_big_model.py"
FRAMEWORKS = ("plain", "accelerate", "accelerando")


@dataclass(frozen=True)
class Case:
    title: str  # formatted with the SIZES in use
    model: str  # "mlp" or "transformer"
    precision: str  # "no" or "bf16"
    accumulation: int
    steps: tuple[int, int]  # (warm-up, timed) micro-steps at full size; both multiples of accumulation
    small_steps: tuple[int, int]


CASES = {
    "mlp": Case("4×Linear({width}) MLP, fp32, AdamW, batch {batch}", "mlp", "no", 1, (50, 600), (4, 30)),
    "mlp-accumulate": Case("same, `accumulate` over 4 micro-batches", "mlp", "no", 4, (48, 800), (4, 32)),
    "transformer": Case(
        "{layers}-layer {d_model}-wide transformer, bf16 autocast, seq {seq}, batch {seqs}",
        "transformer",
        "bf16",
        1,
        (5, 20),
        (2, 5),
    ),
}
SIZES = {
    False: {"width": 1024, "batch": 256, "d_model": 2048, "heads": 16, "layers": 8, "seq": 1024, "seqs": 8},
    True: {"width": 128, "batch": 32, "d_model": 64, "heads": 4, "layers": 2, "seq": 32, "seqs": 4},
}


# ---- the worker: one case, one framework, one fresh process ------------------------------------
def build(case: Case, small: bool, device: str) -> tuple[Any, list[tuple[Any, Any]]]:
    """The model and a few batches, created directly on the device (same seed for every framework)."""
    import torch
    from torch import nn

    s = SIZES[small]
    torch.manual_seed(0)
    with torch.device(device):
        if case.model == "mlp":
            w = s["width"]
            model: nn.Module = nn.Sequential(
                nn.Linear(w, w),
                nn.ReLU(),
                nn.Linear(w, w),
                nn.ReLU(),
                nn.Linear(w, w),
                nn.ReLU(),
                nn.Linear(w, w),
            )
            batches = [(torch.randn(s["batch"], w), torch.randn(s["batch"], w)) for _ in range(4)]
        else:
            d = s["d_model"]
            layers = [
                nn.TransformerEncoderLayer(
                    d, s["heads"], 4 * d, dropout=0.0, batch_first=True, norm_first=True
                )
                for _ in range(s["layers"])
            ]
            model = nn.Sequential(*layers)
            batches = [
                (torch.randn(s["seqs"], s["seq"], d), torch.randn(s["seqs"], s["seq"], d)) for _ in range(2)
            ]
    return model, batches


def plain_step(case: Case, model: Any, opt: Any, device: str) -> Callable[[int, Any, Any], None]:
    import torch

    def step(i: int, x: Any, y: Any) -> None:
        cast = (
            torch.autocast(device, dtype=torch.bfloat16)
            if case.precision == "bf16"
            else contextlib.nullcontext()
        )
        with cast:
            out = model(x)
        loss = torch.nn.functional.mse_loss(out.float(), y)
        (loss / case.accumulation if case.accumulation > 1 else loss).backward()
        if (i + 1) % case.accumulation == 0:
            opt.step()
            opt.zero_grad()

    return step


def framework_step(
    framework: str, case: Case, model: Any, opt: Any, device: str
) -> Callable[[int, Any, Any], None]:
    import torch

    if framework == "accelerate":
        from accelerate import Accelerator
    else:
        from accelerando import Accelerator
    acc = Accelerator(
        cpu=device == "cpu", mixed_precision=case.precision, gradient_accumulation_steps=case.accumulation
    )
    model, opt = acc.prepare(model, opt)
    if acc.device.type != device:
        raise RuntimeError(f"{framework} chose device {acc.device}, the benchmark asked for {device}")

    def step(i: int, x: Any, y: Any) -> None:
        acc.backward(torch.nn.functional.mse_loss(model(x), y))
        opt.step()
        opt.zero_grad()

    def accumulating_step(i: int, x: Any, y: Any) -> None:
        with acc.accumulate(model):
            step(i, x, y)

    return accumulating_step if case.accumulation > 1 else step


def seconds_per_step(
    step: Callable[[int, Any, Any], None], batches: list, warmup: int, steps: int, device: str
) -> float:
    """Median-free single measurement: the device is synchronised before and after the timed steps only."""
    import torch

    for i in range(warmup):
        step(i, *batches[i % len(batches)])
    if device == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for i in range(warmup, warmup + steps):
            step(i, *batches[i % len(batches)])
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / steps
    began = time.perf_counter()
    for i in range(warmup, warmup + steps):
        step(i, *batches[i % len(batches)])
    return (time.perf_counter() - began) / steps


def worker(case_name: str, framework: str, device: str, small: bool) -> None:
    import torch

    case = CASES[case_name]
    if device == "cuda":
        torch.cuda.set_device(0)
    model, batches = build(case, small, device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    if framework == "plain":
        step = plain_step(case, model, opt, device)
    else:
        step = framework_step(framework, case, model, opt, device)
    warmup, steps = case.small_steps if small else case.steps
    seconds = seconds_per_step(step, batches, warmup, steps, device)
    name = torch.cuda.get_device_name() if device == "cuda" else f"CPU ({os.cpu_count()} cores)"
    print("RESULT " + json.dumps({"seconds": seconds, "device": name}), flush=True)


# ---- the parent: fresh processes, interleaved rounds, one table ----------------------------------
def child_env(cpu: bool = False) -> dict[str, str]:
    """The worker imports this checkout's accelerando, whatever PYTHONPATH the caller set; on CPU it
    uses one thread unless OMP_NUM_THREADS says otherwise (oversubscribed threads drown the signal)."""
    src = str(ROOT / "src")
    path = os.environ.get("PYTHONPATH", "")
    env = {**os.environ, "PYTHONPATH": src if not path else f"{src}{os.pathsep}{path}"}
    if cpu:
        env.setdefault("OMP_NUM_THREADS", "1")
    return env


def run_cell(case: str, framework: str, args: argparse.Namespace) -> dict[str, Any] | None:
    device = "cpu" if args.cpu else "cuda"
    cmd = [sys.executable, __file__, "--worker", case, framework, "--device", device] + (
        ["--small"] if args.small else []
    )
    try:
        proc = subprocess.run(
            cmd, env=child_env(args.cpu), capture_output=True, text=True, timeout=args.cell_timeout
        )
    except subprocess.TimeoutExpired:
        print(f"[gpu.py] {case}/{framework} ran past {args.cell_timeout} s", file=sys.stderr)
        return None
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        print(
            f"[gpu.py] {case}/{framework} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}",
            file=sys.stderr,
        )
        return None
    return json.loads(lines[-1][len("RESULT ") :])


def measure(args: argparse.Namespace, frameworks: list[str]) -> tuple[dict[str, dict[str, list[float]]], str]:
    """Every cell once per round, round after round; `--jobs` > 1 overlaps cells (smoke runs only)."""
    times: dict[str, dict[str, list[float]]] = {c: {f: [] for f in frameworks} for c in args.cases}
    device_name = "?"
    cells = [(case, framework) for case in args.cases for framework in frameworks]
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for round_index in range(args.repeats):
            began = time.monotonic()
            results = pool.map(lambda cell: run_cell(cell[0], cell[1], args), cells)
            for (case, framework), result in zip(cells, results):
                if result is not None:
                    times[case][framework].append(result["seconds"])
                    device_name = result["device"]
            elapsed = time.monotonic() - began
            print(f"[gpu.py] round {round_index + 1}/{args.repeats}: {elapsed:.0f} s", file=sys.stderr)
    return times, device_name


def big_model_rows(args: argparse.Namespace) -> tuple[list[dict[str, Any]], str | None]:
    """Rows from gpu_big_model.py (its contract: a JSON list of rows in seconds); a note when absent."""
    if args.no_big_model:
        return [], "big-model rows: skipped (--no-big-model)"
    if not BIG_MODEL_SCRIPT.exists():
        return [], f"big-model rows: skipped, {BIG_MODEL_SCRIPT.name} is not in this checkout"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.json"
        cmd = [sys.executable, str(BIG_MODEL_SCRIPT), "--json", str(out)] + (
            ["--small"] if args.small else []
        )
        began = time.monotonic()
        try:
            proc = subprocess.run(
                cmd, env=child_env(args.cpu), capture_output=True, text=True, timeout=args.big_model_timeout
            )
        except subprocess.TimeoutExpired:
            return [], f"big-model rows: FAILED, {BIG_MODEL_SCRIPT.name} ran past {args.big_model_timeout} s"
        print(f"[gpu.py] big model: {time.monotonic() - began:.0f} s", file=sys.stderr)
        if proc.returncode != 0 or not out.exists():
            print(proc.stdout[-2000:] + proc.stderr[-3000:], file=sys.stderr)
            return [], f"big-model rows: FAILED, {BIG_MODEL_SCRIPT.name} exited {proc.returncode}"
        return json.loads(out.read_text()), None


def _ratio(value: float | None, plain: float | None) -> str:
    if value is None:
        return ""
    return f"{value / plain:.3f}" if plain else f"{value:.3f} s"


def render(
    times: dict[str, dict[str, list[float]]],
    big: list[dict[str, Any]],
    header: str,
    notes: list[str],
    small: bool,
) -> str:
    """The issue's table (ratios to plain PyTorch), then the raw step times it was computed from."""
    median = {c: {f: statistics.median(v) if v else None for f, v in fs.items()} for c, fs in times.items()}
    lines = [
        header,
        "",
        "| case | plain PyTorch | Accelerate | accelerando | transformers |",
        "|---|---|---|---|---|",
    ]
    for case, m in median.items():
        plain = m.get("plain")
        label = CASES[case].title.format(**SIZES[small]) + (
            f" ({plain * 1e3:.2f} ms/step plain)" if plain else " (plain failed)"
        )
        cells = [_ratio(m.get(f), plain) if f in m else "not installed" for f in FRAMEWORKS]
        lines.append(f"| {label} | {' | '.join(cells)} |  |")
    for row in big:
        plain = row.get("plain")
        label = row["case"] + (f" (plain {plain:.3f} {row.get('unit', 's')})" if plain else "")
        cells = [_ratio(row.get(k), plain) for k in ("plain", "accelerate", "accelerando", "transformers")]
        lines.append(f"| {label} | {' | '.join(cells)} |")
    lines += ["", "Raw step times, ms: median [min, max] over the fresh processes of each cell.", ""]
    lines += ["| case | " + " | ".join(FRAMEWORKS) + " |", "|---|---|---|---|"]
    for case, fs in times.items():
        cells = [
            f"{statistics.median(v) * 1e3:.3f} [{min(v) * 1e3:.3f}, {max(v) * 1e3:.3f}]" if v else "—"
            for v in (fs.get(f, []) for f in FRAMEWORKS)
        ]
        lines.append(f"| {case} | {' | '.join(cells)} |")
    return "\n".join(lines + [""] + notes) + "\n"


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu", action="store_true", help="run on CPU (default: CUDA)")
    p.add_argument("--small", action="store_true", help="tiny sizes and few steps (smoke run)")
    p.add_argument(
        "--repeats", type=int, default=None, help="fresh processes per cell (default 3, --small 1)"
    )
    p.add_argument(
        "--jobs", type=int, default=1, help="cells run at once (default 1; more only for smoke runs)"
    )
    p.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    p.add_argument("--markdown", type=Path, help="also write the tables to this file")
    p.add_argument("--no-big-model", action="store_true", help="skip the gpu_big_model.py rows")
    p.add_argument("--cell-timeout", type=float, default=300.0)
    p.add_argument("--big-model-timeout", type=float, default=300.0)
    p.add_argument("--worker", nargs=2, metavar=("CASE", "FRAMEWORK"), help=argparse.SUPPRESS)
    p.add_argument("--device", choices=("cpu", "cuda"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.repeats is None:
        args.repeats = 1 if args.small else 3
    if args.repeats < 1 or args.jobs < 1:
        p.error(f"--repeats and --jobs must be at least 1, got {args.repeats} and {args.jobs}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker(args.worker[0], args.worker[1], args.device, args.small)
        return 0
    if not args.cpu:
        import torch

        if not torch.cuda.is_available():
            print("no CUDA device: run with --cpu (and --small for a quick smoke run)", file=sys.stderr)
            return 2
    accelerate = importlib.util.find_spec("accelerate") is not None
    frameworks = [f for f in FRAMEWORKS if f != "accelerate" or accelerate]
    began = time.monotonic()
    times, device_name = measure(args, frameworks)
    big, note = big_model_rows(args)
    header = (
        f"{device_name}; torch {_version('torch')}, Accelerate {_version('accelerate')}, "
        f"transformers {_version('transformers')}; {'small' if args.small else 'full'} sizes; "
        f"ratio to plain PyTorch of the median over {args.repeats} fresh process(es) per cell"
        + (f", {args.jobs} cells at once (timings not comparable)" if args.jobs > 1 else "")
    )
    failed = [f"{c}/{f}" for c, fs in times.items() for f, v in fs.items() if len(v) < args.repeats]
    notes = [n for n in [note] if n] + ([f"failed runs (see stderr): {', '.join(failed)}"] if failed else [])
    notes.append(f"total {time.monotonic() - began:.0f} s")
    text = render(times, big, header, notes, args.small)
    print(text, end="")
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text)
    return 1 if failed or (note and "FAILED" in note) else 0


if __name__ == "__main__":
    sys.exit(main())
