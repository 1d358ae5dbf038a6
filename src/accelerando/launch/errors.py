"""Turning what torch's elastic agent reports into messages a user reads first.

The agent's `ChildFailedError` lists every failed rank in a wide box after pages of log lines; we
print the root cause (the earliest failure that left a traceback) first, then one line per other
failed rank. Rendezvous failures become one paragraph that names the address and what to check.
"""

from __future__ import annotations

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


def root_cause(failures: dict[int, Any]) -> tuple[int, Any]:
    """The failure to show first: earliest with a traceback, else earliest non-signal, else earliest."""

    def key(item: tuple[int, Any]) -> tuple[int, float, int]:
        rank, failure = item
        tier = 0 if _traceback(failure) else (1 if failure.exitcode > 0 else 2)
        return tier, _time(failure), rank

    return min(failures.items(), key=key)


def _describe(rank: int, failure: Any) -> str:
    if failure.exitcode < 0:
        how = f"was killed by signal {failure.signal_name()}"
    else:
        how = f"exited with code {failure.exitcode}"
    return f"rank {rank} (local rank {failure.local_rank}, pid {failure.pid}) {how}"


def format_child_failure(failures: dict[int, Any], script: str) -> str:
    """A report of the failed worker group: root-cause traceback first, then the others."""
    rank, failure = root_cause(failures)
    lines = [RULE, f"accelerando launch: {script} failed; first failure: {_describe(rank, failure)}", RULE]
    stack = _traceback(failure)
    if stack:
        lines.append(stack.rstrip())
    else:
        lines.append(
            f"(no Python traceback was recorded: the process {failure.message or 'ended without one'}; "
            "its own output above may say why)"
        )
    others = [(r, f) for r, f in sorted(failures.items()) if r != rank]
    if others:
        lines.append("-" * 78)
        for other_rank, other in others:
            message = other.message.get("message", "") if isinstance(other.message, dict) else other.message
            summary = str(message).strip().splitlines()[0] if str(message or "").strip() else ""
            lines.append(f"also: {_describe(other_rank, other)}" + (f": {summary}" if summary else ""))
    lines.append(RULE)
    return "\n".join(lines)


def exit_code(failures: dict[int, Any]) -> int:
    """The launcher's exit status: the root-cause rank's own code when it is a plain failure."""
    _, failure = root_cause(failures)
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
