"""Run a script on several real processes (torchrun's agent, gloo on CPU) from a test.

One launch per feature: scripts batch their checks and fail with an assertion; the failing rank's
traceback comes back in the AssertionError raised here, and a hard timeout turns a hang into a
failure with whatever the ranks printed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from accelerando.config import env as config_env
from accelerando.launch.ports import free_port

__all__ = ["free_port", "native_failures", "run_distributed", "torchrun_command"]

# What a rank prints when it dies in C++ or logs a C++ error: never part of a clean run.
NATIVE_FAILURE_MARKERS = ("terminate called", "Exception raised from", "frame #0:", "Fatal Python error")


def native_failures(text: str) -> list[str]:
    """The lines of `text` that show a native abort or a C++ stack trace."""
    return [line for line in text.splitlines() if any(marker in line for marker in NATIVE_FAILURE_MARKERS)]


def torchrun_command(script: str | Path, args: Sequence[str] = (), nproc: int = 2) -> list[str]:
    """torchrun on this machine with a private rendezvous (`--standalone`).

    The agent's store binds port 0, so the port is taken atomically. A port picked here beforehand
    could be taken by another socket before the agent binds it; torch then joins that port as a
    client of a store that is not there and waits, silent, until the test's timeout (seen beside
    other launches on the same machine).
    """
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={nproc}",
        "--standalone",
        "--monitor_interval=0.1",
        str(script),
        *map(str, args),
    ]


def run_distributed(
    script: str | Path,
    args: Sequence[str] = (),
    *,
    nproc: int = 2,
    timeout: float = 180,
    env: Mapping[str, str] | None = None,
    expect_success: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run `script` on `nproc` ranks; raise AssertionError with the output unless it exits as expected.

    A run expected to succeed must also be clean: a C++ stack trace or abort message in its output
    fails it, since a job that "fails" after its work is done, or warns from C++ at every exit, is a
    defect users see.
    """
    child_env = {
        **config_env.snapshot(),
        "OMP_NUM_THREADS": "1",
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        "PYTHONFAULTHANDLER": "1",  # a hang's SIGABRT (below) prints where every thread of a rank is
    }
    child_env.update(env or {})
    cmd = torchrun_command(script, args, nproc)
    agent = subprocess.Popen(
        cmd, env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, errs = agent.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        out, errs = _end_hung(agent)
        raise AssertionError(
            f"{script} timed out after {timeout}s\n--- stdout\n{out}\n--- stderr\n{errs}"
        ) from None
    proc = subprocess.CompletedProcess(cmd, agent.returncode, out, errs)
    if (proc.returncode == 0) != expect_success:
        raise AssertionError(
            f"{script} exited {proc.returncode} (expected {'0' if expect_success else 'non-zero'})\n"
            f"--- stdout\n{proc.stdout[-8000:]}\n--- stderr\n{proc.stderr[-12000:]}"
        )
    native = native_failures(proc.stdout + proc.stderr) if expect_success else []
    if native:
        raise AssertionError(
            f"{script} exited 0 but printed a native failure: {native[0]!r}\n--- stderr\n{proc.stderr[-12000:]}"
        )
    return proc


def _tree(root: int) -> list[int]:
    """`root` and every process descending from it (Linux: read from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    todo, tree = [root], []
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo += children.get(pid, [])
    return tree


def _end_hung(agent: subprocess.Popen[str]) -> tuple[str, str]:
    """SIGABRT every rank (with PYTHONFAULTHANDLER each prints every thread's stack), then SIGKILL
    the process group of the agent and of each rank (torchrun gives each rank a session of its own);
    the agent's stdout and stderr, read all along so that no rank blocks writing its stacks."""
    tree = _tree(agent.pid)
    for pid in tree[1:]:
        try:
            os.kill(pid, signal.SIGABRT)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        output = agent.communicate(timeout=5)  # the agent ends once its ranks have
    except subprocess.TimeoutExpired:
        output = None
    for pid in tree:  # whatever outlived the abort
        try:
            os.killpg(os.getpgid(pid), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return output or agent.communicate()
