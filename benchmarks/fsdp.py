"""FSDP2 vs DDP: step time and per-rank peak memory on the same model and data, side by side.

Each mode runs in its own torchrun launch (so a process's peak memory is its own) with 2 ranks:
  * ddp               plain `DistributedDataParallel` + AdamW (the baseline)
  * torch-fsdp2       plain `fully_shard` per block + root, optimizer built after sharding
  * accelerando-fsdp2 `Accelerator(fsdp_plugin=...)`, optimizer built before `prepare` (re-bound)
  * accelerate-fsdp2  Hugging Face Accelerate's FSDP2 path, measured only when it is importable
Per rank it reports the median step time, the bytes of parameters + gradients + AdamW state the
rank holds (exact), and the peak memory growth (CUDA: max allocated; CPU: peak RSS growth).

    python benchmarks/fsdp.py                 # CPU/gloo (nccl on CUDA), dim 1024, 8 blocks
    python benchmarks/fsdp.py --dim 256 --steps 5 --repeats 1  # seconds
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

MODES = ("ddp", "torch-fsdp2", "accelerando-fsdp2", "accelerate-fsdp2")


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class Model(nn.Module):
    def __init__(self, dim: int, depth: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim) for _ in range(depth))
        self.head = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _memory(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _prepare(mode: str, model: nn.Module, device: torch.device) -> tuple[Any, Any, Any]:
    """(model, optimizer, backward function) for one mode; everything else is identical."""
    import torch.distributed as dist

    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index] if device.type == "cuda" else None
        model = DistributedDataParallel(model.to(device), device_ids=ids)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-4), lambda loss: loss.backward()
    if mode == "torch-fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        model = model.to(device)
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-4), lambda loss: loss.backward()
    if mode == "accelerando-fsdp2":
        from accelerando import Accelerator
        from accelerando.config.fsdp import FullyShardedDataParallelPlugin

        acc = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(transformer_cls_names_to_wrap=["Block"]))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        model, opt = acc.prepare(model, opt)
        return model, opt, acc.backward
    from accelerate import Accelerator as HFAccelerator
    from accelerate.utils import FullyShardedDataParallelPlugin as HFPlugin

    plugin = HFPlugin(
        fsdp_version=2, auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=["Block"]
    )
    hf = HFAccelerator(fsdp_plugin=plugin)
    if str(hf.distributed_type) != "DistributedType.FSDP":
        # Accelerate only shards on accelerators; on CPU it picks plain processes or DDP.
        raise _Skip(
            f"accelerate {_version('accelerate')} does not run FSDP here (it chose {hf.distributed_type})"
        )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, opt = hf.prepare(model, opt)
    return model, opt, hf.backward


class _Skip(Exception):
    """This mode cannot run on this machine; the reason goes in the table."""


def _version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


def _held_bytes(model: nn.Module, opt: torch.optim.Optimizer) -> int:
    """Parameters, gradients and optimizer state this rank stores (local shards for DTensors)."""

    def local(t: torch.Tensor) -> torch.Tensor:
        return t.to_local() if hasattr(t, "to_local") else t

    total = 0
    for p in model.parameters():
        total += local(p).numel() * p.element_size()
        if p.grad is not None:
            total += local(p.grad).numel() * p.grad.element_size()
    inner = getattr(opt, "optimizer", opt)
    for state in inner.state.values():
        total += sum(
            local(v).numel() * v.element_size() for v in state.values() if torch.is_tensor(v) and v.dim()
        )
    return total


def worker(args: argparse.Namespace) -> None:
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    before = _memory(device)
    try:
        model, opt, backward = _prepare(args.mode, Model(args.dim, args.depth), device)
    except _Skip as reason:
        if rank == 0:
            with open(args.out, "a") as f:
                f.write(json.dumps({"mode": args.mode, "rank": rank, "skipped": str(reason)}) + "\n")
        dist.destroy_process_group()
        return
    g = torch.Generator().manual_seed(rank)
    times = []
    for step in range(args.warmup + args.steps):
        x = torch.randn(args.batch, args.dim, generator=g).to(device)
        start = time.perf_counter()
        backward(model(x).pow(2).mean())
        opt.step()
        if step == args.warmup + args.steps - 1:
            held = _held_bytes(model, opt)
        opt.zero_grad()
        if cuda:
            torch.cuda.synchronize()
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
    row = {
        "mode": args.mode,
        "rank": rank,
        "step_ms": statistics.median(times) * 1000,
        "held_mib": held / 2**20,
        "peak_growth_mib": _memory(device) - before,
    }
    with open(args.out, "a") as f:
        f.write(json.dumps(row) + "\n")
    dist.barrier()
    dist.destroy_process_group()


def _importable(mode: str) -> bool:
    if mode != "accelerate-fsdp2":
        return True
    try:
        import accelerate  # noqa: F401
    except ImportError:
        return False
    return True


def driver(args: argparse.Namespace) -> None:
    from accelerando.testing.distributed import torchrun_command

    out = Path(tempfile.mkdtemp()) / "rows.jsonl"
    nproc = max(torch.cuda.device_count(), 2) if torch.cuda.is_available() else 2
    params = sum(p.numel() for p in Model(args.dim, args.depth).parameters())
    print(
        f"model: {params / 1e6:.1f} M parameters ({params * 4 / 2**20:.0f} MiB fp32), {nproc} ranks, batch {args.batch}"
    )
    runnable = [m for m in MODES if _importable(m)]
    for mode in set(MODES) - set(runnable):
        print(f"{mode}: skipped (accelerate is not installed)")
    # Repeats go round the modes in turn, so a burst of load from elsewhere hits every mode alike;
    # each mode reports its fastest repeat.
    for mode in [m for _ in range(args.repeats) for m in runnable]:
        flags = [
            "--worker",
            "--mode",
            mode,
            "--out",
            str(out),
            "--dim",
            str(args.dim),
            "--depth",
            str(args.depth),
            "--steps",
            str(args.steps),
            "--warmup",
            str(args.warmup),
            "--batch",
            str(args.batch),
        ]
        cmd = torchrun_command(__file__, flags, nproc=nproc)
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if proc.returncode:
            print(f"{mode}: failed\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    _print_table(rows)


def _fastest_repeat(group: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows come in rank-complete repeats (one row per rank, in launch order); keep the fastest."""
    if "skipped" in group[0]:
        return group[:1]
    ranks = len({r["rank"] for r in group})
    repeats = [group[i : i + ranks] for i in range(0, len(group), ranks)]
    return min(repeats, key=lambda rows: statistics.mean(r["step_ms"] for r in rows))


def _print_table(rows: list[dict[str, Any]]) -> None:
    by_mode: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_mode.setdefault(row["mode"], []).append(row)
    by_mode = {mode: _fastest_repeat(group) for mode, group in by_mode.items()}
    base = by_mode.get("ddp")
    base_ms = statistics.mean(r["step_ms"] for r in base) if base else float("nan")
    print("\n| mode | step ms (mean of ranks) | vs ddp | held MiB/rank | peak growth MiB/rank (max) |")
    print("|---|---|---|---|---|")
    for mode, group in by_mode.items():
        if "skipped" in group[0]:
            print(f"| {mode} | skipped: {group[0]['skipped']} | | | |")
            continue
        ms = statistics.mean(r["step_ms"] for r in group)
        held = max(r["held_mib"] for r in group)
        peak = max(r["peak_growth_mib"] for r in group)
        print(f"| {mode} | {ms:.1f} | {ms / base_ms:.2f}x | {held:.0f} | {peak:.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=MODES, default="ddp", help=argparse.SUPPRESS)
    parser.add_argument("--out", default="", help=argparse.SUPPRESS)
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2, help="launches per mode; the fastest is shown")
    args = parser.parse_args()
    worker(args) if args.worker else driver(args)


if __name__ == "__main__":
    sys.exit(main())
