"""Failure reports put the root cause first; memory estimates follow the documented accounting."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from accelerando.commands.estimate import estimate
from accelerando.launch.errors import exit_code, format_child_failure, root_cause


@dataclass
class Failure:
    local_rank: int
    exitcode: int
    timestamp: int
    error_file_data: dict[str, Any] = field(default_factory=dict)
    message: Any = ""
    pid: int = 100

    def signal_name(self) -> str:
        return "SIGTERM"


def recorded(text: str, when: float) -> dict[str, Any]:
    return {
        "message": {
            "message": text,
            "extraInfo": {"py_callstack": f"Traceback\n{text}\n", "time": repr(when)},
        }
    }


def test_root_cause_is_earliest_recorded_failure() -> None:
    failures = {
        0: Failure(0, 1, 10, recorded("RuntimeError: peer closed", 10.7)),
        1: Failure(1, 3, 10, recorded("ValueError: boom", 10.2)),
        2: Failure(0, -15, 9),
    }
    assert root_cause(failures)[0] == 1
    text = format_child_failure(failures, "train.py")
    assert text.index("ValueError: boom") < text.index("also: rank 0")
    assert "first failure: rank 1" in text and "killed by signal SIGTERM" in text
    assert exit_code(failures) == 3


def test_a_signal_the_agent_did_not_send_is_the_root_cause() -> None:
    """kill -9 of rank 1: rank 0 then raises a peer error and the agent SIGTERMs it."""
    failures = {
        0: Failure(0, -15, 10, recorded("RuntimeError: Connection reset by peer", 10.1), pid=100),
        1: Failure(1, -9, 11, pid=101),
    }
    assert root_cause(failures)[0] == 0  # without knowing who signalled whom: the traceback
    assert root_cause(failures, agent_signalled={100})[0] == 1
    text = format_child_failure(failures, "train.py", {100}, tracebacks_shown=True)
    assert "first failure: rank 1 (local rank 1, pid 101) was killed by signal" in text
    assert (
        "(not sent by the launcher)" in text and "also: rank 0" in text and "(sent by the launcher)" in text
    )
    assert "Traceback" not in text  # the worker printed rank 0's; the report does not repeat it
    assert exit_code(failures, {100}) == 1


def test_a_rank_that_raised_before_its_own_abort_is_not_the_root_cause() -> None:
    """kill -9 of rank 1; rank 0 raises "Connection closed by peer", then gloo aborts it at exit
    (SIGABRT, not sent by the launcher, recorded before rank 1's whole-second timestamp)."""
    failures = {
        0: Failure(0, -6, 11, recorded("RuntimeError: Connection closed by peer", 10.4), pid=100),
        1: Failure(1, -9, 11, pid=101),
    }
    assert root_cause(failures, agent_signalled=set())[0] == 1
    alone = {0: failures[0]}  # without the killed peer, the exception is still the cause shown
    assert root_cause(alone, agent_signalled=set())[0] == 0


def test_estimate_strategies_shard_as_documented() -> None:
    single = estimate(1000, "float32", "single", 4)
    assert (single.weights, single.gradients, single.optimizer) == (4000, 4000, 8000)
    z2 = estimate(1000, "bfloat16", "ZeRO-2", 4)
    assert (z2.weights, z2.gradients, z2.optimizer) == (2000, 500, 3000)
    assert estimate(1000, "float32", "FSDP", 4).total == 4000
    with pytest.raises(ValueError, match="strategy 'ZeRO-9'"):
        estimate(1, "float32", "ZeRO-9", 2)


def test_restart_notice_names_the_rank_that_failed_first() -> None:
    """torch's "will restart worker group" line says nothing of who failed; ours names the root cause."""
    import logging

    from accelerando.launch.errors import AgentSignals
    from accelerando.launch.torchrun import FailureMemo, _RestartNotice

    lines: list[str] = []
    memo, signals = FailureMemo(), AgentSignals()
    memo.failures = {
        0: Failure(0, 1, 10, recorded("RuntimeError: Connection closed by peer", 10.7), pid=11),
        1: Failure(1, 2, 10, recorded("ValueError: bad batch", 10.2), pid=12),
    }
    notice = _RestartNotice(lines.append, memo, signals)
    msg = "[%s] Worker group %s. %s/%s attempts left; will restart worker group"
    record = logging.LogRecord("agent", logging.INFO, __file__, 1, msg, ("default", "FAILED", 1, 1), None)
    notice.emit(record)
    assert lines == [
        "accelerando launch: rank 1 (local rank 1, pid 12) exited with code 2; "
        "Worker group FAILED. 1/1 attempts left; will restart worker group"
    ]
    assert memo.failures == {}  # the next restart names its own failure


def test_a_rank_killed_while_recording_its_error_leaves_no_half_written_error_file(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch's agent json-loads a rank's error file as soon as a peer fails; a file it finds empty
    ended `accelerando launch` with 'Expecting value: line 1 column 1' (seen beside a CPU hog)."""
    import json

    from accelerando.launch import worker

    path = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))

    def killed_mid_write(data: Any, fh: Any) -> None:
        fh.write('{"message": ')
        fh.flush()
        raise OSError("killed")

    monkeypatch.setattr(worker.json, "dump", killed_mid_write)
    worker.record(RuntimeError("first"))
    assert not path.exists(), "a reader must find the whole file or none"
    assert list(tmp_path.iterdir()) == [], "nor a temporary file left behind"
    monkeypatch.undo()
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    worker.record(RuntimeError("boom"))
    assert json.loads(path.read_text())["message"]["message"] == "RuntimeError: boom"
