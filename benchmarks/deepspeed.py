"""DeepSpeed ZeRO-1/2/3 vs DDP vs FSDP2, and accelerando's cost over calling deepspeed.initialize.

Each mode runs in its own torchrun launch (so a process's peak memory is its own), 2 ranks
(every GPU on a CUDA machine), same model, data and AdamW:
  * ddp                    plain `DistributedDataParallel`
  * fsdp2                  plain `fully_shard` per block + root
  * deepspeed-zeroN        `deepspeed.initialize` called directly, `engine.backward` + `engine.step`
  * accelerando-zeroN      `Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=N))`, the
                           Accelerate loop (`accelerator.backward`, `optimizer.step`, `zero_grad`)
  * overhead-zeroN         both of the above in one process on twin models, steps interleaved
                           (alternating which goes first), so load from elsewhere hits both alike:
                           accelerando's cost over `deepspeed.initialize` is the median of the
                           per-step time ratios of a launch, and the median of that over launches
Per rank: the median step time, the bytes of parameters + optimizer state (fp32 master copies and
AdamW moments) this rank keeps, and the peak memory growth while training (CUDA: max allocated;
CPU: peak RSS growth, measured after `import deepspeed` in the DeepSpeed modes).

    python benchmarks/deepspeed.py                        # dim 512, 8 blocks, 2 repeats
    python benchmarks/deepspeed.py --dim 256 --repeats 1  # a quick look
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

# This file is named like the package it measures: drop its folder from the path so that
# `import deepspeed` finds DeepSpeed, not this script.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import torch  # noqa: E402
from torch import nn  # noqa: E402

STAGES = (1, 2, 3)
MODES = (
    "ddp",
    "fsdp2",
    *(f"{who}-zero{s}" for s in STAGES for who in ("deepspeed", "accelerando")),
    *(f"overhead-zero{s}" for s in STAGES),
)


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


def _ds_config(stage: int, batch: int, world: int) -> dict[str, Any]:
    """What accelerando fills for the same plugin: the raw baseline runs the identical engine."""
    return {
        "train_micro_batch_size_per_gpu": batch,
        "train_batch_size": batch * world,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 0.0,
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**12,
    }


def _prepare(mode: str, model: nn.Module, device: torch.device, batch: int) -> tuple[Any, Any, Any, Any]:
    """(model, step function, object holding the state, optimizer) for one mode."""
    import torch.distributed as dist

    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index] if device.type == "cuda" else None
        model = DistributedDataParallel(model.to(device), device_ids=ids)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        return model, _torch_step(opt), model, opt
    if mode == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        model = model.to(device)
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        return model, _torch_step(opt), model, opt
    stage = int(mode[-1])
    if mode.startswith("deepspeed"):
        import deepspeed

        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        config = _ds_config(stage, batch, dist.get_world_size())
        engine, _, _, _ = deepspeed.initialize(
            model=model, optimizer=opt, config=config, dist_init_required=False
        )

        def raw_step(loss: torch.Tensor) -> None:
            engine.backward(loss)
            engine.step()

        return engine, raw_step, engine, engine.optimizer
    from accelerando import Accelerator
    from accelerando.utils import DeepSpeedPlugin

    acc = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=stage))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loader = torch.utils.data.DataLoader(torch.zeros(batch * dist.get_world_size(), 1), batch_size=batch)
    model, opt, _ = acc.prepare(model, opt, loader)  # the loader gives "auto" its batch size

    def accelerando_step(loss: torch.Tensor) -> None:
        acc.backward(loss)
        opt.step()
        opt.zero_grad()

    return model, accelerando_step, model, opt.optimizer


def _torch_step(opt: torch.optim.Optimizer) -> Any:
    def step(loss: torch.Tensor) -> None:
        loss.backward()
        opt.step()
        opt.zero_grad()

    return step


def _held_bytes(model: nn.Module, opt: Any) -> int:
    """Parameters this rank keeps (local shard / ZeRO-3 partition) + every tensor of the optimizer:
    its own parameters when they are not the model's (ZeRO's fp32 master partitions) and its state."""

    def local(t: torch.Tensor) -> torch.Tensor:
        if hasattr(t, "ds_tensor"):
            return t.ds_tensor  # type: ignore[no-any-return]
        return t.to_local() if hasattr(t, "to_local") else t

    module = getattr(model, "module", model)
    params = list(module.parameters())
    total = sum(local(p).numel() * p.element_size() for p in params)
    seen = {id(p) for p in params}
    inner = getattr(opt, "optimizer", opt)
    for group in inner.param_groups:
        for p in group["params"]:
            if id(p) not in seen:
                seen.add(id(p))
                total += local(p).numel() * p.element_size()
    for state in inner.state.values():
        total += sum(
            local(v).numel() * v.element_size() for v in state.values() if torch.is_tensor(v) and v.dim()
        )
    return total


def _overhead(args: argparse.Namespace, device: torch.device, rank: int) -> dict[str, Any]:
    """accelerando's step against the raw engine's, interleaved in one process on twin models."""
    import copy

    model = Model(args.dim, args.depth)
    twin = copy.deepcopy(model)
    stage = int(args.mode[-1])
    acc_model, acc_step, _, _ = _prepare(f"accelerando-zero{stage}", twin, device, args.batch)
    raw_model, raw_step, _, _ = _prepare(f"deepspeed-zero{stage}", model, device, args.batch)
    runs = {"raw": (raw_model, raw_step), "accelerando": (acc_model, acc_step)}
    g = torch.Generator().manual_seed(rank)
    times: dict[str, list[float]] = {"raw": [], "accelerando": []}
    for i in range(args.warmup + args.steps):
        x = torch.randn(args.batch, args.dim, generator=g).to(device)
        for name in ("raw", "accelerando") if i % 2 else ("accelerando", "raw"):
            model_, step = runs[name]
            start = time.perf_counter()
            step(model_(x).pow(2).mean())
            if device.type == "cuda":
                torch.cuda.synchronize()
            if i >= args.warmup:
                times[name].append(time.perf_counter() - start)
    ratios = [a / r for a, r in zip(times["accelerando"], times["raw"])]
    return {
        "mode": args.mode,
        "rank": rank,
        "raw_ms": statistics.median(times["raw"]) * 1000,
        "step_ms": statistics.median(times["accelerando"]) * 1000,
        "ratio": statistics.median(ratios),
    }


def worker(args: argparse.Namespace) -> None:
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if "zero" in args.mode:
        import deepspeed

        if not cuda:
            deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # as accelerando does on CPU
    torch.manual_seed(0)
    if args.mode.startswith("overhead"):
        row = _overhead(args, device, rank)
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")
        dist.barrier()
        dist.destroy_process_group()
        return
    model = Model(args.dim, args.depth)
    before = _memory(device)
    model, step, holder, opt = _prepare(args.mode, model, device, args.batch)
    g = torch.Generator().manual_seed(rank)
    times = []
    for i in range(args.warmup + args.steps):
        x = torch.randn(args.batch, args.dim, generator=g).to(device)
        start = time.perf_counter()
        step(model(x).pow(2).mean())
        if cuda:
            torch.cuda.synchronize()
        if i >= args.warmup:
            times.append(time.perf_counter() - start)
    row = {
        "mode": args.mode,
        "rank": rank,
        "step_ms": statistics.median(times) * 1000,
        "held_mib": _held_bytes(holder, opt) / 2**20,
        "peak_growth_mib": _memory(device) - before,
    }
    with open(args.out, "a") as f:
        f.write(json.dumps(row) + "\n")
    dist.barrier()
    dist.destroy_process_group()


def driver(args: argparse.Namespace) -> None:
    from accelerando.testing.distributed import torchrun_command

    out = Path(tempfile.mkdtemp()) / "rows.jsonl"
    nproc = args.nproc or (max(torch.cuda.device_count(), 2) if torch.cuda.is_available() else 2)
    params = sum(p.numel() for p in Model(args.dim, args.depth).parameters())
    print(
        f"model: {params / 1e6:.1f} M parameters ({params * 4 / 2**20:.0f} MiB fp32), {nproc} ranks, batch {args.batch}"
    )
    # Repeats go round the modes in turn, so a burst of load from elsewhere hits every mode alike;
    # each mode reports its fastest repeat.
    for mode in [m for _ in range(args.repeats) for m in args.modes]:
        flags = ["--worker", "--mode", mode, "--out", str(out), "--dim", str(args.dim), "--depth", str(args.depth),
                 "--steps", str(args.steps), "--warmup", str(args.warmup), "--batch", str(args.batch)]  # fmt: skip
        cmd = torchrun_command(__file__, flags, nproc=nproc)
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if proc.returncode:
            print(f"{mode}: failed\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    _print_table(rows)


def _fastest_repeat(group: list[dict[str, Any]]) -> list[dict[str, Any]]:
    ranks = len({r["rank"] for r in group})
    repeats = [group[i : i + ranks] for i in range(0, len(group), ranks)]
    return min(repeats, key=lambda rows: statistics.mean(r["step_ms"] for r in rows))


def _print_table(rows: list[dict[str, Any]]) -> None:
    by_mode: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_mode.setdefault(row["mode"], []).append(row)
    every = dict(by_mode)
    by_mode = {mode: _fastest_repeat(group) for mode, group in by_mode.items()}
    ms = {mode: statistics.mean(r["step_ms"] for r in group) for mode, group in by_mode.items()}
    base = ms.get("ddp", float("nan"))
    print(
        "\n| mode | step ms (mean of ranks) | vs ddp | params+optimizer MiB/rank | peak growth MiB/rank (max) |"
    )
    print("|---|---|---|---|---|")
    for mode, group in by_mode.items():
        if mode.startswith("overhead"):
            continue
        held = max(r["held_mib"] for r in group)
        peak = max(r["peak_growth_mib"] for r in group)
        print(f"| {mode} | {ms[mode]:.1f} | {ms[mode] / base:.2f}x | {held:.0f} | {peak:.0f} |")
    overhead = {mode: group for mode, group in by_mode.items() if mode.startswith("overhead")}
    if overhead:
        print("\n| ZeRO stage | deepspeed.initialize ms | accelerando ms | accelerando / deepspeed: median over launches (each: median of step ratios, max of ranks) | every launch |")  # fmt: skip
        print("|---|---|---|---|---|")
        for mode, group in overhead.items():
            raw = statistics.mean(r["raw_ms"] for r in group)
            ranks = len({r["rank"] for r in group})
            launches = [every[mode][i : i + ranks] for i in range(0, len(every[mode]), ranks)]
            ratios = [max(r["ratio"] for r in launch) for launch in launches]
            spread = ", ".join(f"{r:.3f}" for r in ratios)
            print(
                f"| {mode[-1]} | {raw:.1f} | {ms[mode]:.1f} | {statistics.median(ratios):.3f}x | {spread} |"
            )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=MODES, default="ddp", help=argparse.SUPPRESS)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES), help="modes to run")
    parser.add_argument("--out", default="", help=argparse.SUPPRESS)
    parser.add_argument("--nproc", type=int, default=None, help="ranks (default: 2, or every GPU)")
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2, help="launches per mode; the fastest is shown")
    args = parser.parse_args()
    worker(args) if args.worker else driver(args)


if __name__ == "__main__":
    sys.exit(main())
