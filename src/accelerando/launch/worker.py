"""Runs inside each training process before the user's script: pins it, records an uncaught exception.

Started by file path (`python -u .../worker.py --script train.py args...`), so it imports nothing
from accelerando or torch: the script sees the same `sys.argv`, `sys.path[0]` and `__main__` it
would under `python train.py`. For the same reason it reads its few variables from `os.environ`
itself (the one module besides `config/env.py` allowed to). With `--enable_cpu_affinity` the
process is first pinned to its local rank's share of the cores; with `--as_accelerate` it imports
accelerando first, which turns `accelerando.as_accelerate()` on (the script then imports transformers
and `accelerate` as usual). If the script raises, the
traceback (without these frames) goes to stderr and, in the JSON layout torch's `ProcessFailure`
reads, to `$TORCHELASTIC_ERROR_FILE`; the launcher prints it first.
"""

import sys

if __name__ == "__main__" and len(sys.argv) > 2:
    # Replace this file's folder on the path before anything else is imported from it.
    sys.path[0] = (
        ""
        if sys.argv[1] == "--module"
        else __import__("os").path.dirname(__import__("os").path.abspath(sys.argv[2]))
    )

import json  # noqa: E402
import os  # noqa: E402
import runpy  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Mapping  # noqa: E402
from types import TracebackType  # noqa: E402

_TRUE = ("1", "true", "yes", "on", "y", "t")
_SKIP = {os.path.abspath(__file__), os.path.abspath(runpy.__file__), "<frozen runpy>"}


def _user_frames(tb: TracebackType | None, skip: frozenset[str] = frozenset()) -> TracebackType | None:
    """Drop the leading frames of this file and of runpy (and `skip`), which only add noise."""

    def name(frame_tb: TracebackType) -> str:
        filename = frame_tb.tb_frame.f_code.co_filename
        return filename if filename.startswith("<") else os.path.abspath(filename)

    while tb is not None and (name(tb) in _SKIP or name(tb) in skip):
        tb = tb.tb_next
    return tb


def record(exc: BaseException, skip: frozenset[str] = frozenset()) -> str:
    """Print the traceback and write it where the agent looks for it; returns the text."""
    text = "".join(traceback.format_exception(type(exc), exc, _user_frames(exc.__traceback__, skip)))
    rank = os.environ.get("RANK", "?")
    sys.stderr.write(f"[rank {rank}] {text}")
    sys.stderr.flush()
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if path:
        now = time.time()
        data = {
            "message": {
                "message": f"{type(exc).__name__}: {exc}",
                "extraInfo": {"py_callstack": text, "timestamp": str(int(now)), "time": repr(now)},
            }
        }
        try:
            with open(path, "w") as fh:
                json.dump(data, fh)
        except OSError as err:
            sys.stderr.write(f"accelerando: could not write the error file {path}: {err}\n")
    return text


def core_share(cores: list[int], local_rank: int, local_size: int) -> list[int]:
    """Local rank i of n gets the i-th of n contiguous, near-equal slices of `cores`.

    Contiguous core numbers usually share a socket and its memory. With fewer cores than local
    ranks, ranks share cores round-robin, one core each.
    """
    if not cores or not 0 <= local_rank < local_size:
        raise ValueError(f"no core share for local rank {local_rank} of {local_size} over cores {cores}")
    if len(cores) < local_size:
        return [cores[local_rank % len(cores)]]
    return cores[local_rank * len(cores) // local_size : (local_rank + 1) * len(cores) // local_size]


def pin_to_core_share(environ: Mapping[str, str] = os.environ) -> list[int] | None:
    """`--enable_cpu_affinity`: restrict this process to its share of the cores it may use now."""
    value = environ.get("ACCELERANDO_CPU_AFFINITY", environ.get("ACCELERATE_CPU_AFFINITY", ""))
    if value.strip().lower() not in _TRUE:
        return None
    if not hasattr(os, "sched_setaffinity"):
        sys.stderr.write(
            "accelerando: --enable_cpu_affinity needs Linux (os.sched_setaffinity); not pinned\n"
        )
        return None
    local_rank, local_size = int(environ.get("LOCAL_RANK", "0")), int(environ.get("LOCAL_WORLD_SIZE", "1"))
    share = core_share(sorted(os.sched_getaffinity(0)), local_rank, local_size)
    os.sched_setaffinity(0, share)
    return share


def as_accelerate_requested(environ: Mapping[str, str] = os.environ) -> bool:
    """`--as_accelerate` (ACCELERANDO_AS_ACCELERATE): the switch must be on before the script runs."""
    value = environ.get("ACCELERANDO_AS_ACCELERATE", environ.get("ACCELERATE_AS_ACCELERATE", ""))
    return value.strip().lower() in _TRUE


def main(argv: list[str]) -> int:
    """`--script PATH args...` or `--module NAME args...`."""
    if len(argv) < 2 or argv[0] not in ("--script", "--module"):
        sys.stderr.write("usage: worker.py --script PATH [args...] | --module NAME [args...]\n")
        return 2
    mode, target, rest = argv[0], argv[1], argv[2:]
    pin_to_core_share()
    try:
        if as_accelerate_requested():
            import accelerando  # noqa: F401 - importing it with the variable set turns the switch on

        if mode == "--module":
            sys.argv = [target, *rest]
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.argv = [target, *rest]
            runpy.run_path(target, run_name="__main__")
    except SystemExit:
        raise
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the launcher
        record(exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
