"""Start the training processes with torchrun's elastic agent, in this process.

`torch.distributed.launcher.api.launch_agent` does the work (rendezvous, worker processes, health
checks, restarts); this module turns a resolved launch configuration into its `LaunchConfig`,
keeps the agent's log lines out of the way, and reports failures root cause first.
"""

from __future__ import annotations

import logging
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accelerando.config import env as envmod
from accelerando.launch.errors import (
    AgentSignals,
    describe_failure,
    exit_code,
    format_child_failure,
    format_rendezvous_failure,
    root_cause,
)
from accelerando.launch.settings import Resolved, child_exports, parse_rdzv_conf, parse_tee

WORKER = Path(__file__).with_name("worker.py")
_RESTART_MARK = "will restart worker group"


@dataclass(frozen=True)
class Target:
    """What each process runs: a script path, a module (`-m`), or an executable (`--no_python`)."""

    script: str
    args: tuple[str, ...] = ()
    module: bool = False
    no_python: bool = False

    def __post_init__(self) -> None:
        if self.module and self.no_python:
            raise ValueError("--module and --no_python exclude each other")
        if not self.script:
            raise ValueError("no training script given: accelerando launch [flags] script.py [script args]")
        if not (self.module or self.no_python) and not Path(self.script).is_file():
            raise ValueError(f"training script {self.script!r} does not exist")

    def entrypoint(self) -> tuple[str, list[str]]:
        """Executable and arguments: all go through the worker bootstrap (parent-death signal; Python
        targets also get their exception recorded); `--no_python` programs are exec'd by it."""
        mode = "--exec" if self.no_python else "--module" if self.module else "--script"
        return sys.executable, ["-u", str(WORKER), mode, self.script, *self.args]


def rendezvous_configs(r: Resolved) -> dict[str, Any]:
    """torch's rdzv_configs: user entries plus who hosts the store (machine 0) or the node rank."""
    configs: dict[str, Any] = dict(parse_rdzv_conf(r["rdzv_conf"]))
    configs.pop("rdzv_id", None)
    if r["rdzv_backend"] == "static":
        configs.setdefault("rank", r["machine_rank"])
    else:
        # Machine 0 hosts the store; others must connect to it, never start their own (on loopback
        # torch would otherwise guess "this is the host" on every node).
        configs.setdefault("is_host", r["machine_rank"] == 0)
    return configs


def endpoint(r: Resolved) -> str:
    return f"{r['main_process_ip']}:{r['main_process_port']}"


@contextmanager
def agent_log_dir(chosen: str | None) -> Iterator[str]:
    """The folder the agent keeps its per-rank error files (and `--tee` logs) in: `--log_dir`, kept;
    without it, a temporary folder removed when the launch ends.

    torch's agent would otherwise make a `torchelastic_*` folder in the temporary directory on every
    launch and never remove it: a long-lived machine collects thousands.
    """
    if chosen:
        yield chosen
        return
    folder = tempfile.mkdtemp(prefix="accelerando-launch-")
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def build_launch_config(r: Resolved, log_dir: str) -> Any:
    """The agent's LaunchConfig for this machine, writing its logs under `log_dir`."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.launcher.api import LaunchConfig

    tee = parse_tee(r["tee"])
    run_id = parse_rdzv_conf(r["rdzv_conf"]).get("rdzv_id") or "accelerando"
    return LaunchConfig(
        min_nodes=r["num_machines"],
        max_nodes=r["num_machines"],
        nproc_per_node=r["nproc_per_node"],
        logs_specs=DefaultLogsSpecs(log_dir=log_dir, tee=tee),
        run_id=run_id,
        role=r["role"],
        rdzv_endpoint=endpoint(r),
        rdzv_backend=r["rdzv_backend"],
        rdzv_configs=rendezvous_configs(r),
        max_restarts=r["max_restarts"],
        monitor_interval=r["monitor_interval"],
        start_method="spawn",
    )


class FailureMemo:
    """The failures of the worker group's latest failed check, kept for the restart notice.

    torch's agent logs "will restart worker group" without saying which worker failed; the notice
    names it, so a restarted job's log says what it recovered from.
    """

    def __init__(self) -> None:
        self.failures: dict[int, Any] = {}

    @contextmanager
    def watching(self) -> Iterator[None]:
        """While the agent runs, remember what each failed health check of the workers found."""
        from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

        original = LocalElasticAgent._monitor_workers

        def monitor(agent: Any, group: Any) -> Any:
            result = original(agent, group)
            if result.is_failed():
                self.failures = dict(result.failures)
            return result

        LocalElasticAgent._monitor_workers = monitor  # type: ignore[method-assign]
        try:
            yield
        finally:
            LocalElasticAgent._monitor_workers = original  # type: ignore[method-assign]


class _RestartNotice(logging.Handler):
    """Shows the agent's one useful INFO line (a restart), naming the rank that failed first, while
    its other chatter stays hidden."""

    def __init__(self, write: Callable[[str], None], memo: FailureMemo, signals: AgentSignals) -> None:
        super().__init__(logging.INFO)
        self._write, self._memo, self._signals = write, memo, signals

    def emit(self, record: logging.LogRecord) -> None:
        if _RESTART_MARK not in record.getMessage():
            return
        notice = record.getMessage().split("] ", 1)[-1]
        if self._memo.failures:
            rank, failure = root_cause(self._memo.failures, self._signals.pids)
            notice = f"{describe_failure(rank, failure, self._signals.pids)}; {notice}"
            self._memo.failures = {}
        self._write(f"accelerando launch: {notice}")


def quiet_agent_logs(
    debug: bool, write: Callable[[str], None], memo: FailureMemo | None = None
) -> AgentSignals:
    """Silence torch's elastic loggers unless `--debug`; keep restart notices.

    Returns the handler that records which workers the agent itself signalled (for the report).
    """
    import torch.distributed.elastic.agent.server.api as agent_api
    import torch.distributed.elastic.multiprocessing.api as mp_api
    import torch.distributed.elastic.rendezvous.c10d_rendezvous_backend  # noqa: F401 - create its logger now
    import torch.distributed.elastic.rendezvous.dynamic_rendezvous  # noqa: F401
    import torch.distributed.elastic.rendezvous.static_tcp_rendezvous  # noqa: F401

    signals = AgentSignals()
    mp_logger = mp_api.logger
    mp_logger.handlers = [h for h in mp_logger.handlers if not isinstance(h, AgentSignals)] + [signals]
    if debug:
        logging.basicConfig(level=logging.INFO)
        for name in list(logging.Logger.manager.loggerDict):
            if name.startswith(("torch.distributed.elastic", "torch.distributed.launcher")):
                logging.getLogger(name).setLevel(logging.INFO)
        return signals
    for name in list(logging.Logger.manager.loggerDict):
        if name.startswith(("torch.distributed.elastic", "torch.distributed.launcher")):
            logging.getLogger(name).setLevel(logging.CRITICAL + 1)
    agent_logger = agent_api.logger
    agent_logger.setLevel(logging.INFO)
    agent_logger.propagate = False
    agent_logger.handlers = [_RestartNotice(write, memo or FailureMemo(), signals)]
    mp_logger.setLevel(logging.WARNING)  # its closing-signal lines reach `signals` only
    mp_logger.propagate = False
    return signals


def connect_timeout(r: Resolved) -> float:
    """How long torch would try to reach machine 0's store: read_timeout (c10d) or timeout (static)."""
    conf = parse_rdzv_conf(r["rdzv_conf"])
    key, default = ("timeout", 900.0) if r["rdzv_backend"] == "static" else ("read_timeout", 60.0)
    try:
        return float(conf.get(key, default))
    except ValueError:
        raise ValueError(f"--rdzv_conf {key}={conf[key]!r} must be a number of seconds") from None


def wait_for_main(host: str, port: int, timeout: float) -> None:
    """Block until machine 0's rendezvous port accepts connections; TimeoutError naming it otherwise.

    Done before the agent starts so that an unreachable main node gives one clear message instead
    of torch's C++ retry dumps.
    """
    deadline = time.monotonic() + timeout
    last: OSError | None = None
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"nothing accepted a connection at {host}:{port} within {timeout:g}s ({last})")
        try:
            with socket.create_connection((host, port), timeout=min(remaining, 5.0)):
                return
        except OSError as err:
            last = err
            time.sleep(min(0.5, max(remaining, 0)))


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run(r: Resolved, target: Target, device_type: str, write: Callable[[str], None] = _stderr) -> int:
    """Launch the worker group on this machine and wait; returns the exit status for the CLI."""
    envmod.export(envmod.launch_environment(child_exports(r, device_type)))
    with agent_log_dir(r["log_dir"]) as log_dir:
        return _run_agent(r, target, build_launch_config(r, log_dir), write)


def _run_agent(r: Resolved, target: Target, config: Any, write: Callable[[str], None]) -> int:
    """Run torch's agent; a failure becomes one report, root cause first, and an exit status."""
    from torch.distributed import DistError
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError
    from torch.distributed.launcher.api import launch_agent

    memo = FailureMemo()
    signals = quiet_agent_logs(bool(r["debug"]), write, memo)
    if r["num_machines"] > 1:
        write(
            f"accelerando launch: machine {r['machine_rank']} of {r['num_machines']} joining the "
            f"{r['rdzv_backend']} rendezvous at {endpoint(r)} with {r['nproc_per_node']} process(es)"
        )
    command, args = target.entrypoint()
    try:
        if r["machine_rank"] > 0:
            wait_for_main(r["main_process_ip"], r["main_process_port"], connect_timeout(r))
        with memo.watching():
            launch_agent(config, command, args)
    except ChildFailedError as err:
        shown = not target.no_python  # the worker bootstrap printed each traceback already
        write(format_child_failure(err.failures, target.script, signals.pids, tracebacks_shown=shown))
        return exit_code(err.failures, signals.pids)
    except (RendezvousError, DistError, TimeoutError) as err:
        write(format_rendezvous_failure(err, endpoint(r), r["machine_rank"], r["num_machines"]))
        return 1
    except SignalException as err:
        write(f"accelerando launch: stopped by signal {err.sigval.name}; the processes were terminated")
        return 128 + int(err.sigval)
    return 0


def script_args(values: Sequence[str]) -> tuple[str, ...]:
    """Script arguments as given after the script (a leading `--` separator is dropped)."""
    items = list(values)
    return tuple(items[1:] if items[:1] == ["--"] else items)
