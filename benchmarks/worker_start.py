"""What the worker start watch adds to a pass's first batch, measured side by side in one run.

    python benchmarks/worker_start.py [--workers 2] [--repeats 30]

One process, forked workers (Linux's default). For each repeat, in rotating order: a plain
`DataLoader`, the prepared loader with the watch off (`ACCELERANDO_DATALOADER_WORKER_START_TIMEOUT=0`)
and with it on; each opens a pass and takes its first batch (the workers are forked then). Prints
the medians and each prepared loader's median ratio to the plain loader of the same repeat.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings
from collections.abc import Callable

from torch.utils.data import DataLoader

from accelerando.data.prepare import prepare_data_loader
from accelerando.data.worker_start import TIMEOUT_VARIABLE

VARIABLE = "ACCELERANDO_" + TIMEOUT_VARIABLE


def first_batch_seconds(make: Callable[[], DataLoader], watch: str | None) -> float:
    if watch is not None:
        os.environ[VARIABLE] = watch
    loader = make()
    start = time.perf_counter()
    next(iter(loader))
    seconds = time.perf_counter() - start
    os.environ.pop(VARIABLE, None)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message="This DataLoader will create")  # more workers than cores
    data = list(range(4096))

    def plain() -> DataLoader:
        return DataLoader(data, batch_size=64, num_workers=args.workers)

    def prepared() -> DataLoader:
        return prepare_data_loader(plain(), put_on_device=False)

    cases = {
        "plain DataLoader": (plain, None),
        "prepared, watch off": (prepared, "0"),
        "prepared, watch on": (prepared, None),
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    names = list(cases)
    for repeat in range(args.repeats):
        for name in names[repeat % 3 :] + names[: repeat % 3]:
            times[name].append(first_batch_seconds(*cases[name]))
    base = times["plain DataLoader"]
    print(f"first batch of a pass, {args.workers} forked workers, median of {args.repeats} repeats")
    for name, values in times.items():
        ratio = statistics.median(v / b for v, b in zip(values, base))
        print(f"  {name:22s} {statistics.median(values) * 1e3:7.1f} ms   {ratio:.2f}x plain")


if __name__ == "__main__":
    main()
