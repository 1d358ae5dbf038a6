"""Runs inside each training process before the user's script: pins it, records an uncaught exception.

Started by file path (`python -u .../worker.py --script train.py args...`), so it imports nothing
from accelerando or torch: the script sees the same `sys.argv`, `sys.path[0]` and `__main__` it
would under `python train.py`. For the same reason it reads its few variables from `os.environ`
itself (the one module besides `config/env.py` allowed to). With `--enable_cpu_affinity` the
process is first pinned to its local rank's share of the cores; with `--as_accelerate` it imports
accelerando first, which turns `accelerando.as_accelerate()` on (the script then imports transformers
and `accelerate` as usual). If the script raises, the
traceback (without these frames) goes to stderr and, in the JSON layout torch's `ProcessFailure`
reads, to `$TORCHELASTIC_ERROR_FILE`; the launcher names it first. A gloo group the script left
is then destroyed (within a deadline), so the process exits with its error at once, rather than
by gloo's abort at exit or after waiting on a peer for the group's timeout.

Every process started this way asks the kernel to kill it when its parent, the launcher's agent,
dies (`prctl(PR_SET_PDEATHSIG)`), so a `kill -9` of `accelerando launch` leaves no orphan ranks
training on; `--exec PROGRAM args...` (the `--no_python` path) does the same, then becomes PROGRAM.
"""

import sys

if __name__ == "__main__" and len(sys.argv) > 2:
    # Replace this file's folder on the path before anything else is imported from it.
    sys.path[0] = (
        ""
        if sys.argv[1] == "--module"
        else __import__("os").path.dirname(__import__("os").path.abspath(sys.argv[2]))
    )

import ctypes  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import runpy  # noqa: E402
import signal  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Mapping  # noqa: E402
from types import TracebackType  # noqa: E402
from typing import Any  # noqa: E402

_TRUE = ("1", "true", "yes", "on", "y", "t")
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_CLOSE_DEADLINE = 5.0  # seconds a failed script's process group may take to shut down
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
        tmp = f"{path}.{os.getpid()}.tmp"  # the agent reads the file as soon as a peer fails: never half-written
        try:
            with open(tmp, "w") as fh:
                json.dump(data, fh)
            os.replace(tmp, path)
        except OSError as err:
            if os.path.exists(tmp):
                os.unlink(tmp)
            sys.stderr.write(f"accelerando: could not write the error file {path}: {err}\n")
    return text


def die_with_parent(environ: Mapping[str, str] = os.environ) -> bool:
    """Have the kernel SIGKILL this process when the agent that started it dies; True if armed.

    SIGKILL, not SIGTERM: the agent is gone, nobody would wait for a graceful exit, and a rank
    blocked in a collective with a dead peer might never get to a SIGTERM handler. The signal is
    tied to the parent, so it is armed only when the parent is the agent named by
    `ACCELERANDO_AGENT_PID`; if the agent died before the call, the parent already changed and the
    process ends at once. Linux only (elsewhere the agent's own shutdown is the only cleanup).
    """
    agent = environ.get("ACCELERANDO_AGENT_PID", "")
    if not agent.isdigit() or not sys.platform.startswith("linux"):
        return False
    if os.getppid() != int(agent):
        return False  # started by something else (a nested launcher, a user's own subprocess)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        return False
    if os.getppid() != int(agent):  # the agent died between the check above and prctl
        os.kill(os.getpid(), signal.SIGKILL)
    return True


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


def close_gloo_group(deadline: float = _CLOSE_DEADLINE) -> None:
    """Destroy the script's default gloo group, if it left one, after it raised.

    Left to the interpreter's exit, such a group either aborts the process ("terminate called
    without an active exception", SIGABRT, in 9 of 20 runs after its peer died), so that the
    launcher reports a signal instead of the exception just recorded, or, with an operation still
    pending on a live peer, keeps it alive until that peer gives up (the group's timeout, 30 minutes
    by default) while the launcher, seeing no process end, waits too. Destroyed here, the process
    exits with its exception; one that does not shut down within `deadline` seconds is ended at
    once with status 1. torch is looked up, never imported.
    """
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return
        if dist.get_backend() != "gloo":
            return
    except Exception:  # noqa: BLE001 - the exception already recorded is the one to report
        return
    closer = threading.Thread(target=_destroy_quietly, args=(dist,), daemon=True)
    closer.start()
    closer.join(deadline)
    if closer.is_alive():
        sys.stderr.write(
            f"[accelerando] the process group did not shut down within {deadline:g} s (an operation"
            " was still waiting for a peer); ending this process with status 1\n"
        )
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


def _destroy_quietly(dist: Any) -> None:
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - the exception already recorded is the one to report
        pass


def main(argv: list[str]) -> int:
    """`--script PATH args...`, `--module NAME args...` or `--exec PROGRAM args...`."""
    if len(argv) < 2 or argv[0] not in ("--script", "--module", "--exec"):
        sys.stderr.write(
            "usage: worker.py --script PATH [args...] | --module NAME [args...] | --exec PROGRAM\n"
        )
        return 2
    mode, target, rest = argv[0], argv[1], argv[2:]
    die_with_parent()
    pin_to_core_share()
    if mode == "--exec":
        os.execvp(target, [target, *rest])  # the parent-death signal survives exec
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
        close_gloo_group()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
