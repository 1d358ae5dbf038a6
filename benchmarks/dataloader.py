"""Iteration overhead of prepared data loaders, on 2 processes, in one run.

    python benchmarks/dataloader.py [--samples 16384] [--batch-size 64] [--repeats 7] [--sample-us 0]

Runs itself under torchrun (gloo, CPU) and prints, for one epoch over the same dataset: plain
`DataLoader` + `DistributedSampler` (the baseline), accelerando's prepared loader, accelerando
with `dispatch_batches=True`, the floor of any dispatcher (rank 0 reading every rank's batches and
sending nothing), and the same two through Hugging Face Accelerate when it is importable. Times
are the slowest rank's, median over interleaved repeats (the order rotates each repeat); each
ratio is the median over repeats of the loader's time against the plain loader's (and, for a
dispatcher, the floor's) in the same repeat. Then what `skip_first_batches` adds to
the time to the first batch when it jumps to batch 2,000, with cheap and with expensive samples
(it must not grow with the cost of a sample).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class Images(Dataset):
    """CIFAR-sized samples; `cost_us` of busy work per sample stands for decoding / augmentation."""

    def __init__(self, n: int, cost_us: float = 0.0) -> None:
        self.n = n
        self.cost = cost_us / 1e6

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if self.cost:
            end = time.perf_counter() + self.cost
            while time.perf_counter() < end:
                pass
        return torch.full((3, 32, 32), float(i % 251)), i % 10


def _launch(argv: list[str]) -> int:
    from accelerando.testing import torchrun_command

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.call(torchrun_command(__file__, argv, nproc=2), env=env)


def _accelerate_factories(ds: Dataset, bs: int) -> dict[str, Callable[[], Any]]:
    try:
        from accelerate.data_loader import prepare_data_loader as acc_prepare
    except ImportError:
        return {}

    def make(dispatch: bool) -> Callable[[], Any]:
        def build() -> Any:
            dl = DataLoader(ds, batch_size=bs, shuffle=True)
            return acc_prepare(
                dl,
                device=torch.device("cpu"),
                num_processes=dist.get_world_size(),
                process_index=dist.get_rank(),
                dispatch_batches=dispatch,
                put_on_device=dispatch,  # Accelerate refuses dispatch without it; a no-op on CPU
                use_seedable_sampler=True,
                data_seed=0,
            )

        return build

    return {"accelerate": make(False), "accelerate dispatch_batches": make(True)}


def _factories(ds: Dataset, bs: int, epoch: list[int]) -> dict[str, Callable[[], Any]]:
    from accelerando.config.options import DataLoaderConfiguration
    from accelerando.data import prepare_data_loader

    rank, world = dist.get_rank(), dist.get_world_size()

    def plain() -> Any:
        sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=0)
        sampler.set_epoch(epoch[0])
        return DataLoader(ds, batch_size=bs, sampler=sampler)

    def ours(dispatch: bool) -> Callable[[], Any]:
        cfg = DataLoaderConfiguration(dispatch_batches=dispatch, data_seed=0)

        def build() -> Any:
            dl = DataLoader(ds, batch_size=bs, shuffle=True)
            return prepare_data_loader(
                dl, num_processes=world, process_index=rank, device=None, config=cfg, gradient_state=None
            )

        return build

    def rank0_alone() -> Any:
        """The floor of any dispatcher: rank 0 reads every rank's batches and sends nothing."""
        return DataLoader(ds, batch_size=bs, shuffle=True) if rank == 0 else []

    out = {"plain DataLoader + DistributedSampler": plain, "accelerando": ours(False)}
    out.update({"accelerando dispatch_batches": ours(True)})
    out[FLOOR] = rank0_alone
    out.update(_accelerate_factories(ds, bs))
    return out


FLOOR = "(floor) rank 0 alone reads all, sends nothing"


def _slowest(seconds: float) -> float:
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _epoch_time(loader: Any) -> float:
    dist.barrier()
    start = time.perf_counter()
    for _ in loader:
        pass
    return _slowest(time.perf_counter() - start)


def bench_iteration(args: argparse.Namespace) -> list[tuple[str, float, float, float | None]]:
    """(loader, median epoch time, median over repeats of its time / plain's time in that repeat,
    the same against the floor for a dispatching loader).

    The ratios pair each loader with the baseline of the same repeat: this machine's speed drifts
    between repeats by more than the overheads measured.
    """
    ds = Images(args.samples, args.sample_us)
    epoch = [0]
    factories = _factories(ds, args.batch_size, epoch)
    times: dict[str, list[float]] = {name: [] for name in factories}
    names = list(factories)
    for rep in range(args.repeats + 1):
        epoch[0] = rep
        shift = rep % len(names)  # rotate the order: no loader always runs right after the same one
        for name in names[shift:] + names[:shift]:
            loader = factories[name]()
            elapsed = _epoch_time(loader)
            if rep:  # the first round warms caches and allocators
                times[name].append(elapsed)
    base, floor = next(iter(times.values())), times[FLOOR]

    def paired(ts: list[float], against: list[float]) -> float:
        return statistics.median(t / b for t, b in zip(ts, against))

    return [
        (
            name,
            statistics.median(ts),
            paired(ts, base),
            paired(ts, floor) if "dispatch" in name else None,
        )
        for name, ts in times.items()
    ]


def _time_to_batch(make: Callable[[], Any], skip: int) -> float:
    from accelerando.data import skip_first_batches

    loader = make()
    dist.barrier()
    start = time.perf_counter()
    next(iter(skip_first_batches(loader, skip)))
    return _slowest(time.perf_counter() - start)


def bench_skip(args: argparse.Namespace) -> list[tuple[str, float]]:
    from accelerando.config.options import DataLoaderConfiguration
    from accelerando.data import prepare_data_loader

    bs, skip = 8, 2000
    rows = []
    for label, cost in (("cheap samples (0 us)", 0.0), ("expensive samples (500 us)", 500.0)):
        ds = Images(bs * dist.get_world_size() * (skip + 50), cost)

        def make(ds: Dataset = ds) -> Any:
            dl = DataLoader(ds, batch_size=bs, shuffle=True)
            cfg = DataLoaderConfiguration(data_seed=0)
            return prepare_data_loader(
                dl,
                num_processes=dist.get_world_size(),
                process_index=dist.get_rank(),
                device=None,
                config=cfg,
                gradient_state=None,
            )

        skipped = min(_time_to_batch(make, skip) for _ in range(3))
        first = min(_time_to_batch(make, 0) for _ in range(3))
        rows.append((f"skip_first_batches to batch {skip}, {label}: skip cost", skipped - first))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--samples", type=int, default=16384)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--sample-us", type=float, default=0.0, help="busy work per sample (decoding)")
    args = parser.parse_args()
    if "LOCAL_RANK" not in os.environ:
        sys.exit(_launch(sys.argv[1:]))
    torch.set_num_threads(1)
    try:  # Accelerate's loaders read its own process state: let it create the process group
        from accelerate import PartialState

        PartialState(cpu=True)
    except ImportError:
        pass
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    rows = bench_iteration(args)
    skips = bench_skip(args)
    if dist.get_rank() == 0:
        print(
            f"\n2 processes (gloo, CPU), {args.samples} samples of 3x32x32 costing {args.sample_us:g} us each, "
            f"batch size {args.batch_size} per process"
        )
        print(f"{'loader':45s} {'epoch (ms)':>11s} {'vs plain':>9s} {'vs floor':>9s}")
        for name, t, ratio, over_floor in rows:
            extra = "" if over_floor is None else f" {over_floor:8.2f}x"
            print(f"{name:45s} {t * 1e3:11.1f} {ratio:8.2f}x{extra}")
        for name, t in skips:
            print(f"{name:60s} {t * 1e3:8.1f} ms")
    from accelerando import PartialState as OurState

    OurState().destroy_process_group()  # gloo aborts a rank whose peer tears down under it


if __name__ == "__main__":
    main()
