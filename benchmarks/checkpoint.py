"""Checkpoint save/load throughput: accelerando vs raw torch.save / safetensors vs the disk itself.

Every save is timed until its bytes are on the disk (fsync), so the numbers compare like with like.
Run: `.venv/bin/python benchmarks/checkpoint.py` (~1 GB model + AdamW state, about 3 GB per save)
or `--small` (~64 MB model) for a quick check, `--size-mb N` for another size. Accelerate is measured
too when it is importable.

The asynchronous rows (`save_state(async_save=True)`) time what training notices: the stall (the
call until it returns, plus the wait of the next optimizer step for the deferred host copy) next to
the synchronous save's time, with every copy made on the caller for comparison, and the steps that
run beside the background write next to steps with no save going on (medians over `--rounds`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from accelerando import Accelerator
from accelerando.checkpoint.atomic import fsync_path


def build(total_bytes: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A stack of square Linear layers of about `total_bytes` fp32 weights, with AdamW state."""
    width = 4096 if total_bytes > 2**28 else 1024
    layers = max(1, total_bytes // (4 * width * width))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for p in model.parameters():
        p.grad = torch.full_like(p, 1e-3)
    opt.step()
    opt.zero_grad()
    return model, opt


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def sync_tree(path: Path) -> None:
    for f in path.rglob("*"):
        if f.is_file():
            fsync_path(f)
    fsync_path(path)


def timed(fn: Callable[[], None]) -> float:
    os.sync()  # earlier runs' dirty pages must not be charged to this one
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def disk_write(path: Path, nbytes: int) -> float:
    """Sequential write of incompressible data with fdatasync at the end: GB/s."""
    block = os.urandom(64 * 2**20)
    os.sync()
    start = time.perf_counter()
    with open(path, "wb") as f:
        for _ in range(max(1, nbytes // len(block))):
            f.write(block)
        f.flush()
        os.fdatasync(f.fileno())
    elapsed = time.perf_counter() - start
    size = path.stat().st_size
    path.unlink()
    return size / elapsed / 1e9


def fresh(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def raw_torch(work: Path, model: torch.nn.Module, opt: torch.optim.Optimizer) -> tuple[float, float, int]:
    d = fresh(work / "raw_torch")

    def save() -> None:
        torch.save(model.state_dict(), d / "model.bin")
        torch.save(opt.state_dict(), d / "optimizer.bin")
        sync_tree(d)

    def load() -> None:
        model.load_state_dict(torch.load(d / "model.bin", weights_only=True))
        opt.load_state_dict(torch.load(d / "optimizer.bin", weights_only=True))

    return timed(save), timed(load), dir_bytes(d)


def raw_safetensors(
    work: Path, model: torch.nn.Module, opt: torch.optim.Optimizer
) -> tuple[float, float, int]:
    from safetensors.torch import load_file, save_file

    d = fresh(work / "raw_st")

    def save() -> None:
        save_file(model.state_dict(), str(d / "model.safetensors"))
        torch.save(opt.state_dict(), d / "optimizer.bin")
        sync_tree(d)

    def load() -> None:
        model.load_state_dict(load_file(str(d / "model.safetensors")))
        opt.load_state_dict(torch.load(d / "optimizer.bin", weights_only=True))

    return timed(save), timed(load), dir_bytes(d)


def ours(work: Path, acc: Accelerator, verify: str) -> tuple[float, float, int]:
    target = work / "ours" / "ck"
    shutil.rmtree(target.parent, ignore_errors=True)
    save_s = timed(lambda: acc.save_state(str(target)))
    load_s = timed(lambda: acc.load_state(str(target), verify=verify))
    return save_s, load_s, dir_bytes(target)


def train_step(acc: Accelerator, model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> None:
    acc.backward(model(x).pow(2).mean())
    opt.step()
    opt.zero_grad()


def steps_per_s(run: Callable[[], None], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        run()
    return n / (time.perf_counter() - start)


@contextlib.contextmanager
def eager_copies(on: bool) -> Iterator[None]:
    """`on`: the caller copies every tensor before save_state returns (as before deferred copies)."""
    from accelerando.checkpoint.async_save import Snapshot

    real = Snapshot.defers
    if on:
        Snapshot.defers = lambda self, src: False  # type: ignore[method-assign]
    try:
        yield
    finally:
        Snapshot.defers = real  # type: ignore[method-assign]


def async_rows(
    work: Path, acc: Accelerator, model: torch.nn.Module, opt: torch.optim.Optimizer, width: int, rounds: int
) -> dict[str, list[float]]:
    """Per round: a synchronous save, an idle step, then an asynchronous save with eager copies and
    one with deferred copies, each followed by training until it is published. Lists per row."""
    x = torch.randn(8, width)
    step = lambda: train_step(acc, model, opt, x)  # noqa: E731
    step()  # warm
    base = work / "ours_async"
    shutil.rmtree(base, ignore_errors=True)
    checkpointer = acc._checkpointer()  # the Accelerator's checkpointer: is the write still going?
    rows: dict[str, list[float]] = {}

    def add(name: str, value: float) -> None:
        rows.setdefault(name, []).append(value)

    os.sync()
    start = time.perf_counter()
    acc.save_state(str(base / "first"), async_save=True)  # allocates the host buffers
    add("first", time.perf_counter() - start)
    checkpointer.wait()
    for r in range(rounds):
        shutil.rmtree(base, ignore_errors=True)
        add("sync", timed(lambda d=str(base / f"sync{r}"): None if acc.save_state(d) else None))
        add("idle_step", timed(step))
        for mode, eager in (("eager", True), ("deferred", False)):
            with eager_copies(eager):
                os.sync()
                start = time.perf_counter()
                acc.save_state(str(base / f"{mode}{r}"), async_save=True)
                call = time.perf_counter() - start
                snapshot = checkpointer._pending.stage.snapshot
                t0 = time.perf_counter()
                step()
                first_step = time.perf_counter() - t0
                steps = 1
                while checkpointer.save_in_progress:
                    step()
                    steps += 1
                during = steps / (time.perf_counter() - t0)
                checkpointer.wait()
                add(f"{mode}_written", time.perf_counter() - start)
            add(f"{mode}_call", call)
            add(f"{mode}_waited", snapshot.waited_s)
            add(f"{mode}_stall", call + snapshot.waited_s)
            add(f"{mode}_step1", first_step)
            add(f"{mode}_during", during)
            add(f"{mode}_steps", steps)
    return rows


def accelerate_run(
    work: Path, model: torch.nn.Module, opt: torch.optim.Optimizer
) -> tuple[float, float, int] | None:
    try:
        import accelerate
    except ImportError:
        return None
    acc = accelerate.Accelerator(cpu=True)
    m, o = acc.prepare(model, opt)
    d = work / "accelerate"
    shutil.rmtree(d, ignore_errors=True)
    save_s = timed(lambda: (acc.save_state(str(d)), sync_tree(d)))
    load_s = timed(lambda: acc.load_state(str(d)))
    return save_s, load_s, dir_bytes(d)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--small", action="store_true", help="~64 MB model instead of ~1 GB")
    parser.add_argument("--size-mb", type=int, default=None, help="model weights in MiB (overrides --small)")
    parser.add_argument("--async-only", action="store_true", help="only the asynchronous save rows")
    parser.add_argument("--dir", default=None, help="scratch directory on the disk to measure")
    parser.add_argument(
        "--rounds", type=int, default=2, help="rounds of every row; the best (async: the median) counts"
    )
    args = parser.parse_args()
    size = args.size_mb * 2**20 if args.size_mb else 64 * 2**20 if args.small else 2**30
    work = Path(tempfile.mkdtemp(prefix="ckpt-bench-", dir=args.dir))
    try:
        model, opt = build(size)
        acc = Accelerator(cpu=True)
        model, opt = acc.prepare(model, opt)
        report_async(work, acc, model, opt, args.rounds)
        if args.async_only:
            return
        disk = disk_write(work / "dd.bin", size)
        best: dict[str, tuple[float, float, int]] = {}
        for _ in range(args.rounds):  # every row gets the same treatment; the best round counts
            runs = [
                ("raw torch.save (model+optim)", raw_torch(work, model, opt.optimizer)),
                ("raw safetensors + torch.save", raw_safetensors(work, model, opt.optimizer)),
                ("accelerando save_state/load_state", ours(work, acc, "full")),
                ("  load_state(verify='size')", ours(work, acc, "size")),
            ]
            other = accelerate_run(work, model, opt.optimizer)
            if other is not None:
                runs.append(("accelerate save_state/load_state", other))
            for name, (save_s, load_s, nbytes) in runs:
                old = best.get(name, (float("inf"), float("inf"), nbytes))
                best[name] = (min(old[0], save_s), min(old[1], load_s), nbytes)
        rows = [(name, *times) for name, times in best.items()]
        print(
            f"disk sequential write (fdatasync): {disk:.2f} GB/s   checkpoint size: {rows[0][3] / 1e9:.2f} GB"
        )
        print(f"{'':36s} {'save s':>7s} {'save GB/s':>9s} {'load s':>7s} {'load GB/s':>9s} {'save/disk':>9s}")
        for name, save_s, load_s, nbytes in rows:
            gbs, lgbs = nbytes / save_s / 1e9, nbytes / load_s / 1e9
            print(f"{name:36s} {save_s:7.2f} {gbs:9.2f} {load_s:7.2f} {lgbs:9.2f} {gbs / disk:9.2f}")
        disk_after = disk_write(work / "dd.bin", size)
        print(f"disk sequential write measured again at the end: {disk_after:.2f} GB/s")
        base = rows[1][1]
        print(f"atomic + manifest overhead vs the same files written raw: {rows[2][1] / base - 1:+.1%}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def report_async(
    work: Path, acc: Accelerator, model: torch.nn.Module, opt: torch.optim.Optimizer, rounds: int
) -> None:
    width = next(model.parameters()).shape[1]
    r = {k: statistics.median(v) for k, v in async_rows(work, acc, model, opt, width, rounds).items()}
    nbytes = dir_bytes(work / "ours_async" / f"deferred{rounds - 1}")
    sync = r["sync"]
    print(f"checkpoint {nbytes / 1e9:.2f} GB; training step: batch 8 through the model, AdamW")
    print(f"medians of {rounds} rounds (each: sync save, idle step, eager async save, deferred async save)")
    print(f"synchronous save_state (synced)                       {sync:7.2f} s")
    print(f"one training step, no save running                   {r['idle_step']:7.2f} s")
    print(
        f"first async save's call (allocates the host buffers)  {r['first']:7.2f} s ({r['first'] / sync:.0%})"
    )
    for mode, what in (("eager", "every copy on the caller"), ("deferred", "copies deferred to the writer")):
        print(f"async_save=True, {what}:")
        print(f"  save_state call returned after                      {r[mode + '_call']:7.2f} s")
        print(f"  next optimizer.step waited for the copy             {r[mode + '_waited']:7.2f} s")
        print(
            f"  stall (call + wait)                                 {r[mode + '_stall']:7.2f} s "
            f"({r[mode + '_stall'] / sync:.1%} of the synchronous save)"
        )
        print(
            f"  first step after the call                           {r[mode + '_step1']:7.2f} s "
            f"(+{r[mode + '_step1'] - r['idle_step']:.2f} s vs no save)"
        )
        print(f"  from the call until published                       {r[mode + '_written']:7.2f} s")
        print(
            f"  steps/s from the call until published               {r[mode + '_during']:7.3f} "
            f"(vs {1 / r['idle_step']:.3f} with no save; {r[mode + '_steps']:.0f} steps)"
        )
    shutil.rmtree(work / "ours_async", ignore_errors=True)


if __name__ == "__main__":
    main()
