"""Turning what torch's elastic agent reports into messages a user reads first.

The agent's `ChildFailedError` lists every failed rank in a wide box after pages of log lines; we
name the root cause first, then one line per other failed rank. The root cause is the rank that
failed on its own: killed by a signal the agent did not send (the OOM killer, `kill -9`), else the
earliest exception. A signal death comes first because it is what makes its peers raise
("Connection reset by peer"), never the other way round; but a rank that recorded an exception
before its signal (a peer's error, then gloo aborting the process at exit: "terminate called
without an active exception") failed because of that exception, and ranks with it. Rendezvous
failures become one paragraph that names the address and what to check.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any

RULE = "=" * 78


def _time(failure: Any) -> float:
    """Sub-second failure time when our worker wrote it, else torch's whole seconds."""
    data = failure.error_file_data if isinstance(failure.error_file_data, dict) else {}
    message = data.get("message")
    if isinstance(message, dict):
        precise = message.get("extraInfo", {}).get("time")
        if precise:
            try:
                return float(precise)
            except ValueError:
                pass
    return float(failure.timestamp)


def _traceback(failure: Any) -> str | None:
    data = failure.error_file_data if isinstance(failure.error_file_data, dict) else {}
    message = data.get("message")
    if isinstance(message, dict):
        stack = message.get("extraInfo", {}).get("py_callstack")
        return str(stack) if stack else None
    return None


class AgentSignals(logging.Handler):
    """Remembers the pids torch's agent sent a closing signal to, from its own log records.

    The agent logs each signal it sends ("Sending process %s closing signal %s", "Closing process
    %s via signal %s", "... forcefully exiting via %s") with the pid as the first argument; a worker
    killed by a signal and not in this set was killed by something else.
    """

    _MARKS = ("closing signal", "via signal", "forcefully exiting")

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.pids: set[int] = set()

    def emit(self, record: logging.LogRecord) -> None:
        if any(mark in str(record.msg) for mark in self._MARKS) and record.args:
            first = record.args[0] if isinstance(record.args, tuple) else None
            if isinstance(first, int):
                self.pids.add(first)


def root_cause(failures: dict[int, Any], agent_signalled: Collection[int] | None = None) -> tuple[int, Any]:
    """The failure to show first (see the module docstring).

    Tiers: killed by a signal the agent did not send, with no exception recorded before it (only
    when `agent_signalled` is known), then the earliest recorded exception, then a plain non-zero
    exit, then the rest; earliest first.
    """

    def key(item: tuple[int, Any]) -> tuple[int, float, int]:
        rank, failure = item
        unprompted = agent_signalled is not None and failure.pid not in agent_signalled
        raised = _traceback(failure) is not None
        if unprompted and failure.exitcode < 0 and not raised:
            tier = 0
        elif raised:
            tier = 1
        else:
            tier = 2 if failure.exitcode > 0 else 3
        return tier, _time(failure), rank

    return min(failures.items(), key=key)


def describe_failure(rank: int, failure: Any, agent_signalled: Collection[int] | None = None) -> str:
    if failure.exitcode < 0:
        how = f"was killed by signal {failure.signal_name()}"
        if agent_signalled is not None:
            how += (
                " (sent by the launcher)" if failure.pid in agent_signalled else " (not sent by the launcher)"
            )
    else:
        how = f"exited with code {failure.exitcode}"
    return f"rank {rank} (local rank {failure.local_rank}, pid {failure.pid}) {how}"


def _summary(failure: Any) -> str:
    message = failure.message.get("message", "") if isinstance(failure.message, dict) else failure.message
    return str(message).strip().splitlines()[0] if str(message or "").strip() else ""


def format_child_failure(
    failures: dict[int, Any],
    script: str,
    agent_signalled: Collection[int] | None = None,
    tracebacks_shown: bool = False,
) -> str:
    """A report of the failed worker group: the root cause first, then one line per other rank.

    `tracebacks_shown`: the workers already printed their tracebacks to this console (the
    `accelerando launch` worker does), so the report names the exception and points there instead
    of printing the same traceback a second time.
    """
    rank, failure = root_cause(failures, agent_signalled)
    headline = f"accelerando launch: {script} failed; first failure: {describe_failure(rank, failure, agent_signalled)}"
    lines = [RULE, headline, RULE]
    stack = _traceback(failure)
    if stack and tracebacks_shown:
        last = stack.rstrip().splitlines()[-1]
        lines.append(f'{last}\n(its full traceback is printed above, after "[rank {rank}] Traceback")')
    elif stack:
        lines.append(stack.rstrip())
    elif failure.exitcode < 0:
        lines.append(
            f"(no Python traceback: a process killed by {failure.signal_name()} cannot record one; if nobody "
            "sent it on purpose, the kernel's out-of-memory killer may have: see `dmesg`)"
        )
    else:
        lines.append(
            f"(no Python traceback was recorded: the process {failure.message or 'ended without one'}; "
            "its own output above may say why)"
        )
    others = [(r, f) for r, f in sorted(failures.items()) if r != rank]
    if others:
        lines.append("-" * 78)
        for other_rank, other in others:
            summary = _summary(other)
            described = describe_failure(other_rank, other, agent_signalled)
            lines.append(f"also: {described}" + (f": {summary}" if summary else ""))
    lines.append(RULE)
    return "\n".join(lines)


def exit_code(failures: dict[int, Any], agent_signalled: Collection[int] | None = None) -> int:
    """The launcher's exit status: the root-cause rank's own code when it is a plain failure."""
    _, failure = root_cause(failures, agent_signalled)
    return int(failure.exitcode) if 0 < failure.exitcode < 256 else 1


def format_rendezvous_failure(exc: BaseException, endpoint: str, machine_rank: int, num_machines: int) -> str:
    """Why this node could not join the job, with what to check."""
    cause = exc
    while cause.__cause__ is not None and str(cause) in ("", str(exc)):
        cause = cause.__cause__
    detail = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
    if machine_rank == 0:
        hint = (
            f"this is machine 0: check that port {endpoint.rsplit(':', 1)[-1]} is free and that the other "
            f"{num_machines - 1} machine(s) were started with --main_process_ip/--main_process_port pointing here"
        )
    else:
        hint = (
            f"check that machine 0 is running `accelerando launch` with the same --main_process_port, that "
            f"{endpoint} is reachable from this machine (firewall, address on the right network interface), "
            "and that every machine uses the same --num_machines"
        )
    return (
        f"{RULE}\naccelerando launch: machine {machine_rank} of {num_machines} could not join the rendezvous "
        f"at {endpoint}\n  {type(exc).__name__}: {detail}\n  {hint}.\n"
        "  Timeouts: --rdzv_conf join_timeout=SECONDS (c10d, default 600), read_timeout=SECONDS (connect, "
        f"default 60), timeout=SECONDS (static, default 900).\n{RULE}"
    )
