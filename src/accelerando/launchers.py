"""`notebook_launcher` and `debug_launcher`, with Accelerate's signatures.

Both run a function on several processes through torch's elastic agent (see
`accelerando.launch.spawn`); a failing rank's exception is re-raised here, in the caller.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from accelerando.config import env as envmod
from accelerando.launch.flags import BY_NAME
from accelerando.launch.ports import free_port, port_is_free

__all__ = ["debug_launcher", "notebook_launcher"]


def _free_or(port: int) -> int:
    return port if port_is_free(port) else free_port()


def _local_device_count() -> tuple[str, int]:
    from accelerando.devices.registry import accelerator_device

    device = accelerator_device()
    return device.type, (device.device_count() if device.type != "cpu" else 0)


def notebook_launcher(
    function: Callable[..., Any],
    args: Sequence[Any] = (),
    num_processes: int | None = None,
    mixed_precision: str = "no",
    use_port: str | int = "29500",
    master_addr: str = "127.0.0.1",
    node_rank: int = 0,
    num_nodes: int = 1,
    rdzv_backend: str = "static",
    rdzv_endpoint: str = "",
    rdzv_conf: dict[str, Any] | None = None,
    rdzv_id: str = "none",
    max_restarts: int = 0,
    monitor_interval: float = 0.1,
    log_line_prefix_template: str | None = None,
) -> None:
    """Run `function(*args)` on `num_processes` processes of this machine (forked), then return.

    One process (the default without accelerators) runs the function right here. On one machine
    the rendezvous is a private c10d one (reliable restarts), whatever `rdzv_backend` says; with
    `num_nodes > 1` the given backend and `rdzv_endpoint` (or `master_addr:use_port`) are used.
    """
    choices = BY_NAME["mixed_precision"].choices or ()
    if mixed_precision not in choices:
        raise ValueError(f"mixed_precision={mixed_precision!r} is not one of {', '.join(choices)}")
    if rdzv_backend not in ("static", "c10d"):
        raise ValueError(f"rdzv_backend={rdzv_backend!r} is not one of static, c10d")
    device_type, count = _local_device_count()
    if num_processes is None:
        num_processes = max(count, 1)
    env = {"ACCELERANDO_MIXED_PRECISION": mixed_precision, "FORK_LAUNCHED": "1"}
    if device_type == "cpu":
        env["ACCELERANDO_USE_CPU"] = "true"
    if num_processes == 1 and num_nodes == 1:
        with envmod.patch_environment(**{k: v for k, v in env.items() if k != "FORK_LAUNCHED"}):
            function(*args)
        return
    from accelerando.launch.spawn import launch_function

    if num_nodes == 1:
        endpoint, backend = f"127.0.0.1:{_free_or(int(use_port))}", "c10d"
    else:
        endpoint, backend = rdzv_endpoint or f"{master_addr}:{use_port}", rdzv_backend
    launch_function(
        function, args, num_processes, env=env, num_nodes=num_nodes, node_rank=node_rank, endpoint=endpoint,
        rdzv_backend=backend, rdzv_conf=rdzv_conf, rdzv_id=rdzv_id if rdzv_id != "none" else "accelerando",
        max_restarts=max_restarts, monitor_interval=monitor_interval,
        log_line_prefix_template=log_line_prefix_template,
    )  # fmt: skip


def debug_launcher(function: Callable[..., Any], args: Sequence[Any] = (), num_processes: int = 2) -> None:
    """Run `function(*args)` on `num_processes` CPU processes (gloo), for tests and debugging."""
    from accelerando.launch.spawn import launch_function

    env = {"ACCELERANDO_USE_CPU": "true", "ACCELERANDO_MIXED_PRECISION": "no", "FORK_LAUNCHED": "1"}
    launch_function(function, args, num_processes, env=env, endpoint=f"127.0.0.1:{free_port()}")
