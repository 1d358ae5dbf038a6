"""The one process-wide runtime: topology, device, process group, precision, strategy, gradient state.

`PartialState`, `AcceleratorState` and `GradientState` (state.py) are views over this object;
there is no shared-dict singleton. `reset_runtime()` returns the process to a clean slate for tests.
"""

from __future__ import annotations

import atexit
import sys
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from accelerando.cluster import ProcessTopology, detect_topology
from accelerando.config import env
from accelerando.config.options import DistributedType, InitProcessGroupKwargs
from accelerando.devices import Device, accelerator_device, get_device

if TYPE_CHECKING:
    from accelerando.precision.base import Precision
    from accelerando.strategies.base import Strategy

_MULTI_TYPES = {
    "cpu": DistributedType.MULTI_CPU,
    "cuda": DistributedType.MULTI_GPU,
    "xpu": DistributedType.MULTI_XPU,
    "npu": DistributedType.MULTI_NPU,
    "mlu": DistributedType.MULTI_MLU,
    "xla": DistributedType.XLA,
}


@dataclass
class GradientRuntime:
    """Accumulation settings and progress, shared by the accelerator, optimizers and schedulers."""

    num_steps: int = 1
    adjust_scheduler: bool = False
    sync_with_dataloader: bool = True
    sync_each_batch: bool = False
    sync_gradients: bool = True
    step_in_window: int = 0
    window_size: int = 1
    dataloaders: list[Any] = field(default_factory=list)
    configured: bool = False
    stale: bool = False  # its runtime was reset (see `reset_runtime`)


@dataclass
class Runtime:
    topology: ProcessTopology
    device_kind: Device
    device: torch.device
    backend: str | None
    distributed_type: DistributedType
    settings: env.EnvSettings
    mixed_precision: str = "no"
    precision: Precision | None = None
    strategy: Strategy | None = None
    accelerator_ready: bool = False
    gradient: GradientRuntime = field(default_factory=GradientRuntime)
    debug: bool = False  # Accelerate's debug mode: collectives first check that every rank's shapes match
    distributed_type_label: DistributedType | None = None  # assigned to `state.distributed_type` (a label)
    stale: bool = False  # reset: views bound to it rebind to the next runtime, or say what happened


_RUNTIME: Runtime | None = None


def current() -> Runtime | None:
    return _RUNTIME


def _select_device(
    cpu: bool, topology: ProcessTopology, settings: env.EnvSettings
) -> tuple[Device, torch.device]:
    if settings.torch_device:
        forced = torch.device(settings.torch_device)
        return get_device(forced.type), forced
    kind = accelerator_device(cpu=cpu)
    if kind.type == "cpu":
        return kind, torch.device("cpu")
    count = max(kind.device_count(), 1)
    index = topology.local_rank % count
    kind.set_current(index)
    return kind, kind.torch_device(index)


def _init_process_group(topology: ProcessTopology, backend: str, kwargs: InitProcessGroupKwargs) -> None:
    """Join the job's process group unless the user already did."""
    if dist.is_initialized():
        return
    timeout = kwargs.timeout or timedelta(minutes=10 if backend == "nccl" else 30)
    where: dict[str, Any] = {}
    if kwargs.init_method is not None:
        where["init_method"] = kwargs.init_method
    elif _NEXT_PORT is not None:  # these processes tore a group down before: never its store again
        is_master = topology.rank == 0  # also under torchrun, whose agent store still holds the old keys
        where["store"] = dist.TCPStore(
            topology.main_address, _NEXT_PORT, topology.world_size, is_master=is_master, timeout=timeout
        )
    elif topology.source == "torchelastic":
        where["init_method"] = "env://"  # reuses the agent's store when torchrun asks for it
    else:
        where["init_method"] = f"tcp://{topology.main_address}:{topology.main_port}"
    dist.init_process_group(
        backend=backend, rank=topology.rank, world_size=topology.world_size, timeout=timeout, **where
    )


_FAILED = False
_DISTRIBUTED = False  # a distributed runtime was created in this process (survives reset_runtime)
_TEARDOWNS = 0  # teardowns so far in this process: each meets under store keys of its own
_NEXT_PORT: int | None = None  # where the next group of these processes meets (set at a teardown)


def _teardown_at_exit() -> None:
    """Destroy the default process group while the interpreter is still whole.

    A gloo group still alive when Python finalizes aborts the process ("terminate called without an
    active exception"): its worker threads still hold work whose tensors reference Python objects.
    This runs for any group still initialized in a process that used a distributed runtime, whoever
    created it and however many times the runtime was reset, so a clean exit never depends on who
    owns the group.
    """
    if _DISTRIBUTED and dist.is_initialized():
        destroy_default_group(meet=not _FAILED)


def destroy_default_group(meet: bool = True) -> None:
    """Destroy the default process group without aborting a peer (what exit and `end_training` use).

    On gloo the ranks first meet at a bounded barrier, so no rank closes its connections while a
    peer is still finishing its last collective (that too aborts the peer), and meet again through
    the store once every rank has destroyed its group, so no rank exits, closing its sockets, while
    a peer is still tearing down. Rank 0 leaves that second meeting last: it may host the store's
    server (`tcp://` and `env://` without torchrun's agent store), and a peer still waiting on a
    vanished server prints a C++ stack trace. A rank exiting because of an uncaught error passes
    `meet=False`: its peers are being stopped by the launcher.
    """
    global _TEARDOWNS
    if not dist.is_initialized():
        return
    meet = meet and dist.get_backend() == "gloo" and dist.get_world_size() > 1
    store = _default_store() if meet else None
    rank, world = dist.get_rank(), dist.get_world_size()
    _TEARDOWNS += 1
    try:
        if meet:
            dist.monitored_barrier(timeout=timedelta(seconds=60))
    except Exception:  # noqa: BLE001 - a peer already left; tear down anyway
        store = None
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - exiting anyway; never turn a clean exit into a crash
        pass
    if store is not None:
        key = f"accelerando/teardown/{env.restart_count()}/{_TEARDOWNS}"
        _agree_next_port(store, key, rank, timeout=timedelta(seconds=60))
        _leave_together(store, key, rank, world, timeout=timedelta(seconds=60))


def _default_store() -> Any:
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:  # noqa: BLE001 - without it the exit is only less safe
        return None


def _agree_next_port(store: Any, key: str, rank: int, timeout: timedelta) -> None:
    """Agree on a fresh port for the next group of these processes (an `Accelerator()` after
    `end_training()` and a runtime reset; several scripts run in one launch).

    The old store must not be joined again: rank 0 closes it last (`_leave_together`), so a peer
    that initialised its next group at once joined it, read the old group's addresses there and
    failed to connect ("Gloo connectFullMesh failed"), or lost its connection when rank 0 closed it
    (a C++ trace); torchrun's shared agent store keeps the old addresses for good. At a port nothing
    holds, a peer waits until rank 0's new store listens.
    """
    global _NEXT_PORT
    try:
        if rank == 0:
            from accelerando.launch.ports import free_port

            store.set(f"{key}/port", str(free_port()))
        store.wait([f"{key}/port"], timeout)
        _NEXT_PORT = int(store.get(f"{key}/port"))
    except Exception:  # noqa: BLE001 - a peer is gone (killed by the launcher): this process ends
        _NEXT_PORT = None


def _leave_together(store: Any, key: str, rank: int, world: int, timeout: timedelta) -> None:
    """Wait (bounded) until every rank has destroyed its group; rank 0 returns only after the others.

    Each meeting is a counter plus a flag set by the last rank to count in; waiting on the flag
    blocks in the store's server, with no polling. After its last store call returns, a rank other
    than 0 touches the store no more, so rank 0 may then close it.
    """
    try:
        _arrive(store, f"{key}/destroyed", expected=world, timeout=timeout)
        if rank != 0:
            _arrive(store, f"{key}/left", expected=world - 1, timeout=None)
        else:
            store.wait([f"{key}/left/all"], timeout)
    except Exception:  # noqa: BLE001 - a peer is gone (killed by the launcher): leave anyway
        pass


def _arrive(store: Any, key: str, expected: int, timeout: timedelta | None) -> None:
    """Count this rank in under `key`; the `expected`-th sets the flag; wait for it unless timeout is None."""
    if store.add(key, 1) == expected:
        store.set(f"{key}/all", "1")
    if timeout is not None:
        store.wait([f"{key}/all"], timeout)


def _install_excepthook(rank: int) -> None:
    """Print an uncaught error with its rank and record it for torchrun's agent (first failure first).

    Installed once per process: a runtime rebuilt after `reset_runtime()` (transformers'
    TrainingArguments resets the state each time) must not chain a second copy that prints again.
    """
    previous = sys.excepthook
    if getattr(previous, "_accelerando_rank", None) == rank:
        return

    def hook(exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
        global _FAILED
        _FAILED = True
        text = "".join(traceback.format_exception(exc_type, exc, tb))
        sys.stderr.write(f"[accelerando] rank {rank} failed:\n{text}")
        sys.stderr.flush()
        if env.raw("TORCHELASTIC_ERROR_FILE"):
            from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

            try:
                ErrorHandler().record_exception(exc)
            except Exception:  # noqa: BLE001 - the report above already reached the user
                pass
        if previous not in (sys.__excepthook__, hook):
            previous(exc_type, exc, tb)

    hook._accelerando_rank = rank  # type: ignore[attr-defined]
    sys.excepthook = hook


def init_runtime(cpu: bool = False, init_kwargs: InitProcessGroupKwargs | None = None) -> Runtime:
    """Create the runtime once per process (idempotent); later calls must agree on `cpu`."""
    global _RUNTIME, _DISTRIBUTED
    settings = env.read_settings()
    cpu = cpu or settings.use_cpu
    if _RUNTIME is not None:
        if cpu and _RUNTIME.device.type != "cpu":
            raise ValueError(
                f"the runtime already uses device {_RUNTIME.device}; cpu=True must be given to the first "
                "PartialState/Accelerator of the process (or call accelerando.state.reset_runtime() first)"
            )
        return _RUNTIME
    init_kwargs = init_kwargs or InitProcessGroupKwargs()
    topology = detect_topology(env.snapshot())
    kind, device = _select_device(cpu, topology, settings)
    backend = init_kwargs.backend or kind.dist_backend
    distributed_type = DistributedType.NO
    if topology.is_distributed:
        _init_process_group(topology, backend, init_kwargs)
        _DISTRIBUTED = True
        distributed_type = _MULTI_TYPES.get(kind.type, DistributedType.MULTI_GPU)
        _install_excepthook(topology.rank)
    _RUNTIME = Runtime(
        topology=topology,
        device_kind=kind,
        device=device,
        backend=backend if topology.is_distributed else None,
        distributed_type=distributed_type,
        settings=settings,
        debug=settings.debug_mode,
    )
    return _RUNTIME


def planned_topology() -> ProcessTopology:
    """The topology this process has, or will have once the runtime starts (pure: no process group)."""
    return _RUNTIME.topology if _RUNTIME is not None else detect_topology(env.snapshot())


def configured_precision() -> str | None:
    """The mixed precision an Accelerator already configured in this process, or None.

    `Accelerator()` without `mixed_precision` keeps it, as Accelerate's shared state does."""
    return _RUNTIME.mixed_precision if _RUNTIME is not None and _RUNTIME.accelerator_ready else None


def require_runtime() -> Runtime:
    return _RUNTIME if _RUNTIME is not None else init_runtime()


def reset_runtime(destroy_process_group: bool = False) -> None:
    """Forget the runtime (tests); optionally tear the process group down too."""
    global _RUNTIME
    if destroy_process_group:
        destroy_default_group()
    if _RUNTIME is not None:
        _RUNTIME.stale = _RUNTIME.gradient.stale = True
    _RUNTIME = None


def reset_error(owner: str, name: str) -> AttributeError:
    """What reading a state object answers between a reset and the next initialisation (Accelerate's words)."""
    return AttributeError(
        f"`{owner}` object has no attribute `{name}`. This happens if `{owner}._reset_state()` was called "
        "and an `Accelerator` or `PartialState` was not reinitialized."
    )


atexit.register(_teardown_at_exit)
