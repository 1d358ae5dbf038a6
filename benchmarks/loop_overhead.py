"""Training-loop overhead of accelerando against the same loop in plain PyTorch (and Accelerate if installed).

Every variant runs in the same worker processes, interleaved round by round, so machine noise hits
all of them alike; the table reports the median time per step and the ratio to plain PyTorch.

    python benchmarks/loop_overhead.py            # 1 and 2 processes, fp32 / accumulation 4 / bf16
    python benchmarks/loop_overhead.py --quick    # fewer steps and rounds
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time

import torch

CASES = {"fp32": (1, "no"), "accum4": (4, "no"), "bf16": (1, "bf16")}


def make_model(width: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(64, width), torch.nn.ReLU(), torch.nn.Linear(width, width), torch.nn.ReLU(),
        torch.nn.Linear(width, 1),
    )  # fmt: skip


def batches(steps: int, rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(rank)
    return [(torch.randn(32, 64, generator=g), torch.randn(32, 1, generator=g)) for _ in range(steps)]


def run_plain(data, accum: int, precision: str, width: int) -> float:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = make_model(width)
    if dist.is_initialized() and dist.get_world_size() > 1:
        model = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    cast = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()
    start = time.perf_counter()
    for i, (x, y) in enumerate(data):
        boundary = (i + 1) % accum == 0
        sync = contextlib.nullcontext() if boundary or not isinstance(model, DDP) else model.no_sync()
        with sync:
            with cast:
                out = model(x)
            loss = torch.nn.functional.mse_loss(out.float(), y) / accum
            loss.backward()
        if boundary:
            opt.step()
            opt.zero_grad()
    return (time.perf_counter() - start) / len(data)


def run_framework(module: str, data, accum: int, precision: str, width: int) -> float:
    lib = __import__(module)
    if module == "accelerando":
        from accelerando.state import reset_runtime

        reset_runtime()
        acc = lib.Accelerator(cpu=True, gradient_accumulation_steps=accum, mixed_precision=precision)
    else:
        from accelerate.state import AcceleratorState, GradientState

        AcceleratorState._reset_state(True)
        GradientState._reset_state()
        acc = lib.Accelerator(cpu=True, gradient_accumulation_steps=accum, mixed_precision=precision)
    model = make_model(width)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    model, opt = acc.prepare(model, opt)
    start = time.perf_counter()
    for x, y in data:
        with acc.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(x), y)
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
    return (time.perf_counter() - start) / len(data)


def worker(steps: int, rounds: int) -> None:
    from accelerando.state import PartialState

    state = PartialState(cpu=True)
    variants = ["plain", "accelerando"] + (["accelerate"] if importlib.util.find_spec("accelerate") else [])
    results: dict[str, dict[str, float]] = {}
    for case, (accum, precision) in CASES.items():
        width = 256 if precision == "bf16" else 1024  # bf16 matmuls are ~6x slower on this CPU
        n = steps // 4 if precision == "bf16" else steps
        data = batches(n, state.process_index)
        times: dict[str, list[float]] = {v: [] for v in variants}
        for _ in range(rounds):
            for v in variants:
                t = (
                    run_plain(data, accum, precision, width)
                    if v == "plain"
                    else run_framework(v, data, accum, precision, width)
                )
                times[v].append(t)
        results[case] = {v: statistics.median(ts) for v, ts in times.items()}
    if state.is_main_process:
        print("RESULT " + json.dumps({"world": state.num_processes, "results": results}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.steps, args.rounds = 60, 3
    if args.worker:
        worker(args.steps, args.rounds)
        return
    rows = []
    for nproc in (1, 2):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               __file__, "--worker", f"--steps={args.steps}", f"--rounds={args.rounds}"]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
        payload = json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:])
        for case, times in payload["results"].items():
            rows.append((nproc, case, times))
    print(
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, median ms/step over {args.rounds} interleaved rounds\n"
    )
    print("| processes | case | plain PyTorch ms | accelerando ms | ratio | Accelerate ratio |")
    print("|---|---|---|---|---|---|")
    for nproc, case, t in rows:
        acc_ratio = f"{t['accelerate'] / t['plain']:.3f}x" if "accelerate" in t else "not installed"
        print(
            f"| {nproc} | {case} | {t['plain'] * 1e3:.3f} | {t['accelerando'] * 1e3:.3f} | "
            f"{t['accelerando'] / t['plain']:.3f}x | {acc_ratio} |"
        )


if __name__ == "__main__":
    main()
