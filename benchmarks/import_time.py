"""What importing the library costs a fresh process, next to torch alone and to Accelerate.

    python benchmarks/import_time.py [--repeats 15]

Every launched rank, launch agent and `accelerando` command pays this once before any work. Each
repeat starts one fresh interpreter per module, in an order that rotates every repeat, and reads
the child's CPU time (user + system) from `getrusage`: CPU time, unlike wall time, hardly moves
when other jobs share the machine. Prints the median per module and what each adds over torch.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
from importlib.util import find_spec

MODULES = ("torch", "accelerando", "accelerate")


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def import_cpu_seconds(module: str) -> float:
    """CPU seconds of a fresh interpreter that imports `module` and exits."""
    before = _children_cpu()
    subprocess.run([sys.executable, "-c", f"import {module}"], check=True)
    return _children_cpu() - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    modules = [m for m in MODULES if find_spec(m) is not None]
    import_cpu_seconds("torch")  # the first run reads torch's files from disk; not counted
    samples: dict[str, list[float]] = {m: [] for m in modules}
    for repeat in range(args.repeats):
        shift = repeat % len(modules)
        for module in modules[shift:] + modules[:shift]:
            samples[module].append(import_cpu_seconds(module))
    floor = statistics.median(samples["torch"])
    print(f"import CPU time, median of {args.repeats} fresh interpreters each")
    print(f"{'module':<12} {'seconds':>8} {'over torch':>11}")
    for module in modules:
        median = statistics.median(samples[module])
        print(f"{module:<12} {median:>8.2f} {median - floor:>+11.2f}")


if __name__ == "__main__":
    main()
