"""What `Accelerator.log()` costs on a rank that is not the main process (target: < 2 us a call).

Runs itself under torchrun (2 processes, gloo, CPU). Both ranks build an Accelerator logging to
TensorBoard and a no-op tracker of their own; rank 1 times `log({"loss": x})` (a no-op there but
for the step counter) in rounds and reports the median per call, next to an empty method call
and, when installed, Accelerate's `Accelerator.log` on the same rank. Rank 0's time (the trackers'
real work) is printed for scale.

    python benchmarks/tracking.py [--calls 200000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable


def _launch(argv: list[str]) -> int:
    from accelerando.testing import torchrun_command

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.call(torchrun_command(__file__, argv, nproc=2), env=env)


def per_call_ns(fn: Callable[[], None], calls: int, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter_ns() - start) / calls)
    return statistics.median(times)


class _Empty:
    def log(self, values: dict, step: int | None = None, log_kwargs: dict | None = None) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    if "LOCAL_RANK" not in os.environ:
        sys.exit(_launch(sys.argv[1:]))

    import torch.distributed as dist

    from accelerando import Accelerator
    from accelerando.tracking import GeneralTracker

    class Nothing(GeneralTracker):
        name = "nothing"
        requires_logging_directory = False
        tracker = None

    out = tempfile.mkdtemp(prefix="bench-tracking-")
    rows: dict[str, float] = {}
    values = {"loss": 0.5}
    accelerate_log = None
    try:  # Accelerate's own state creates the process group first (as in benchmarks/dataloader.py)
        import accelerate

        theirs = accelerate.Accelerator(
            cpu=True, log_with="tensorboard", project_dir=os.path.join(out, "theirs")
        )
        theirs.init_trackers("bench")
        accelerate_log = theirs.log
    except ImportError:
        pass
    acc = Accelerator(cpu=True, log_with=["tensorboard", Nothing()], project_dir=out)
    acc.init_trackers("bench")
    rank = acc.process_index
    empty = _Empty()
    rows["empty method call"] = per_call_ns(lambda: empty.log(values), args.calls, args.rounds)
    if rank == 1:
        rows["accelerando Accelerator.log"] = per_call_ns(lambda: acc.log(values), args.calls, args.rounds)
        if accelerate_log is not None:
            rows["accelerate Accelerator.log"] = per_call_ns(
                lambda: accelerate_log(values), args.calls, args.rounds
            )
    else:  # the main process really writes: fewer calls
        rows["accelerando Accelerator.log"] = per_call_ns(lambda: acc.log(values), 2_000, 3)
    gathered: list[dict[str, float] | None] = [None, None]
    dist.all_gather_object(gathered, rows)
    if rank == 0:
        print(
            f"\nAccelerator.log({json.dumps(values)}) with TensorBoard + one custom tracker, 2 processes (gloo, CPU)"
        )
        print(f"{'':32s} {'rank 1 (ns/call)':>17s} {'rank 0 (ns/call)':>17s}")
        for name in gathered[1] or {}:
            main_ns = (gathered[0] or {}).get(name)
            main = f"{main_ns:17.0f}" if main_ns is not None else f"{'-':>17s}"
            print(f"{name:32s} {(gathered[1] or {})[name]:17.0f} {main}")
    acc.end_training()


if __name__ == "__main__":
    main()
