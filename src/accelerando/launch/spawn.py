"""Run a Python function on several processes from a notebook or a test (`notebook_launcher`).

The same elastic agent as `accelerando launch`, started in this process with the `fork` start
method (a function defined in a notebook cannot be imported by a spawned child). A rank that raises
has its exception pickled to a temporary folder; the caller gets that exception re-raised, with the
rank and remote traceback attached, instead of a generic `ChildFailedError`.
"""

from __future__ import annotations

import pickle
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from accelerando.config import env as envmod
from accelerando.launch.errors import root_cause


class _Recorder:
    """The per-process entry point: runs the function, saves its exception for the caller."""

    def __init__(self, function: Callable[..., Any], folder: str) -> None:
        self.function = function
        self.folder = folder
        self.__name__ = getattr(function, "__name__", "function")
        self.__qualname__ = getattr(function, "__qualname__", self.__name__)

    def __call__(self, *args: Any) -> Any:
        from accelerando.launch.worker import die_with_parent

        die_with_parent()  # a killed notebook kernel or test process takes its ranks with it
        try:
            return self.function(*args)
        except BaseException as exc:
            from accelerando.launch.worker import record

            text = record(exc, skip=frozenset({str(Path(__file__).resolve())}))
            try:
                data = pickle.dumps(exc)
            except Exception:  # noqa: BLE001 - an unpicklable exception still has its traceback
                data = b""
            # torch's own @record wrapper rewrites the error file afterwards (whole-second time),
            # so the precise failure time and the exception travel in this side file.
            payload = {"time": time.time(), "traceback": text, "exception": data}
            rank = envmod.raw("RANK") or "0"
            Path(self.folder, f"rank{rank}.pkl").write_bytes(pickle.dumps(payload))
            raise


def _exception_of(failures: dict[int, Any], folder: str) -> BaseException:
    """The root-cause rank's own exception (or a RuntimeError carrying its traceback)."""
    recorded: dict[int, dict[str, Any]] = {}
    for path in Path(folder).glob("rank*.pkl"):
        try:
            recorded[int(path.stem[4:])] = pickle.loads(path.read_bytes())
        except Exception:  # noqa: BLE001 - a torn file only loses that rank's detail
            continue
    if recorded:
        rank = min(recorded, key=lambda r: (recorded[r]["time"], r))
    else:
        rank = root_cause(failures)[0]
    entry = recorded.get(rank, {})
    failure = failures.get(rank)
    remote = entry.get("traceback") or (f"(no traceback; {failure.message})" if failure else "(no traceback)")
    exc: BaseException | None = None
    if entry.get("exception"):
        try:
            exc = pickle.loads(entry["exception"])
        except Exception:  # noqa: BLE001
            exc = None
    if exc is None:
        code = failure.exitcode if failure else "?"
        return RuntimeError(f"rank {rank} failed (exit code {code})\n{remote}")
    if hasattr(exc, "add_note"):
        exc.add_note(f"raised on rank {rank} of the launched processes; its traceback:\n{remote}")
    return exc


def _check_fresh_process() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        raise ValueError(
            "a torch.distributed process group already exists in this process; notebook_launcher must be "
            "called before any Accelerator/PartialState is created (restart the kernel)"
        )


def launch_function(
    function: Callable[..., Any],
    args: Sequence[Any],
    num_processes: int,
    *,
    env: dict[str, str],
    num_nodes: int = 1,
    node_rank: int = 0,
    endpoint: str = "",
    rdzv_backend: str = "c10d",
    rdzv_conf: dict[str, Any] | None = None,
    rdzv_id: str = "accelerando",
    max_restarts: int = 0,
    monitor_interval: float = 0.1,
    log_line_prefix_template: str | None = None,
) -> None:
    """Start `num_processes` forked workers on this node with torch's agent; re-raise a failure."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, launch_agent

    from accelerando.launch.torchrun import quiet_agent_logs

    if num_processes < 1:
        raise ValueError(f"num_processes={num_processes} must be at least 1")
    _check_fresh_process()
    configs: dict[str, Any] = dict(rdzv_conf or {})
    if rdzv_backend == "static":
        configs.setdefault("rank", node_rank)
    else:
        configs.setdefault("is_host", node_rank == 0)
    config = LaunchConfig(
        min_nodes=num_nodes, max_nodes=num_nodes, nproc_per_node=num_processes, run_id=rdzv_id,
        rdzv_endpoint=endpoint, rdzv_backend=rdzv_backend, rdzv_configs=configs, max_restarts=max_restarts,
        monitor_interval=monitor_interval, start_method="fork", log_line_prefix_template=log_line_prefix_template,
    )  # fmt: skip
    quiet_agent_logs(False, lambda line: print(line, flush=True))
    with tempfile.TemporaryDirectory(prefix="accelerando-launch-") as folder:
        with envmod.patch_environment(**envmod.launch_environment(env)):
            try:
                launch_agent(config, _Recorder(function, folder), list(args))
            except ChildFailedError as err:
                raise _exception_of(err.failures, folder) from None
