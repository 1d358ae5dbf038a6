"""`PartialState`, `AcceleratorState`, `GradientState`: Accelerate's state objects as views.

Every instance reads the one process-wide runtime (`_runtime.py`), so two `PartialState()` calls
always agree; `PartialState` works before any `Accelerator` exists.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

from accelerando import _runtime
from accelerando.config.options import DistributedType, GradientAccumulationPlugin, InitProcessGroupKwargs

__all__ = ["AcceleratorState", "DistributedType", "GradientState", "PartialState", "is_initialized"]


def is_initialized() -> bool:
    """Whether an `Accelerator` has configured this process."""
    runtime = _runtime.current()
    return runtime is not None and runtime.accelerator_ready


def reset_runtime(destroy_process_group: bool = False) -> None:
    _runtime.reset_runtime(destroy_process_group)


class _SharedState:
    """Accelerate's `State._shared_state`, read-only: `{}` until something configured this process,
    then a summary of the runtime (code tests `AcceleratorState._shared_state != {}`)."""

    def __get__(self, instance: Any, owner: type) -> dict[str, Any]:
        runtime = _runtime.current()
        if runtime is None or (owner.__name__ == "AcceleratorState" and not runtime.accelerator_ready):
            return {}
        return {
            "device": runtime.device,
            "distributed_type": runtime.distributed_type,
            "num_processes": runtime.topology.world_size,
            "process_index": runtime.topology.rank,
        }


class _PicklesAsView:
    """A state object is a view of the process's runtime, kept outside its `__dict__`.

    It pickles as a view, never the runtime (models, process groups, data loaders): transformers
    saves its TrainingArguments, which keep a PartialState, with every checkpoint; an unpickled
    view binds to the runtime of the process that uses it, on first use. A view of a reset
    runtime reads the next one (Accelerate's state is one shared dict); with none yet, reading one
    of its properties raises Accelerate's AttributeError. Checked only where the runtime is read
    (`_bound_runtime`), so reading a property costs one attribute check more.
    """

    __slots__ = ("_bound", "__dict__", "__weakref__")
    _bound: Any
    _shared_state = _SharedState()

    def _bind(self) -> Any:
        return _runtime.require_runtime()

    def _bound_runtime(self) -> Any:
        bound = self._bound
        if bound.stale:  # reset since: read the next runtime, or say why there is none
            if _runtime.current() is None:
                raise _runtime.reset_error(type(self).__name__, sys._getframe(2).f_code.co_name)
            bound = self._bound = self._bind()
        return bound

    def __getattr__(self, name: str) -> Any:
        """Reached when normal lookup fails, also when a property raised AttributeError."""
        cls = type(self)
        if name == "_bound":  # unpickled, or never bound: bind to this process's runtime now
            bound = self._bound = self._bind()
            return bound
        if isinstance(getattr(cls, name, None), property) and _runtime.current() is None:
            raise _runtime.reset_error(cls.__name__, name)
        raise AttributeError(f"{cls.__name__!r} object has no attribute {name!r}")

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


class PartialState(_PicklesAsView):
    """Process placement and control: rank, device, barriers, per-rank decorators."""

    def __init__(self, cpu: bool = False, **kwargs: Any) -> None:
        init_kwargs = InitProcessGroupKwargs(**kwargs) if kwargs else None
        self._bound = _runtime.init_runtime(cpu=cpu, init_kwargs=init_kwargs)

    @property
    def _rt(self) -> Any:
        return self._bound_runtime()

    @classmethod
    def _reset_state(cls, reset_partial_state: bool = True) -> None:
        if reset_partial_state:
            _runtime.reset_runtime()

    # ---- placement -------------------------------------------------------------------------
    @property
    def initialized(self) -> bool:
        return _runtime.current() is not None

    @property
    def device(self) -> torch.device:
        return self._rt.device

    @property
    def backend(self) -> str | None:
        return self._rt.backend

    @property
    def distributed_type(self) -> DistributedType:
        """What runs: the strategy's type (a label assigned by the user is reported instead)."""
        if self._rt.distributed_type_label is not None:
            return self._rt.distributed_type_label
        return self._running_type()

    @distributed_type.setter
    def distributed_type(self, value: DistributedType | str) -> None:
        """Accelerate's state lets code assign this (its tests fake FSDP that way). Here the value is
        a label: reported by `distributed_type` until set back, it never changes the strategy that
        runs (docs/architecture.md)."""
        label = DistributedType(value)
        self._rt.distributed_type_label = None if label == self._running_type() else label

    def _running_type(self) -> DistributedType:
        strategy = self._rt.strategy
        return strategy.distributed_type if strategy is not None else self._rt.distributed_type

    @property
    def num_processes(self) -> int:
        return self._rt.topology.world_size

    @property
    def process_index(self) -> int:
        return self._rt.topology.rank

    @property
    def local_process_index(self) -> int:
        return self._rt.topology.local_rank

    @property
    def num_nodes(self) -> int:
        return self._rt.topology.num_nodes

    @property
    def use_distributed(self) -> bool:
        return self._rt.topology.world_size > 1

    @property
    def is_main_process(self) -> bool:
        return self.process_index == 0

    @property
    def is_local_main_process(self) -> bool:
        return self.local_process_index == 0

    @property
    def is_last_process(self) -> bool:
        return self.process_index == self.num_processes - 1

    @property
    def debug(self) -> bool:
        """Accelerate's debug mode (ACCELERANDO_DEBUG_MODE, `launch --debug`): gather, reduce, broadcast
        and pad_across_processes first check that every rank passes the same shapes and raise
        `DistributedOperationException` listing them otherwise; those and `wait_for_everyone` also
        raise, naming each rank's call site, when ranks call different collectives or some never
        call one (ops/announce.py). Settable at run time."""
        return self._rt.debug

    @debug.setter
    def debug(self, value: bool) -> None:
        self._rt.debug = bool(value)

    @property
    def fork_launched(self) -> bool:
        return self._rt.settings.fork_launched

    def set_device(self) -> None:
        if self.device.type != "cpu" and self.device.index is not None:
            self._rt.device_kind.set_current(self.device.index)

    # ---- control ---------------------------------------------------------------------------
    def wait_for_everyone(self) -> None:
        if self.use_distributed:
            if self.debug:  # a barrier reached by some ranks only names every rank's call site
                from accelerando.ops.announce import announce

                announce("wait_for_everyone", [])
            dist.barrier()

    @contextmanager
    def _goes_first(self, is_first: bool) -> Iterator[None]:
        if not is_first:
            self.wait_for_everyone()
        yield
        if is_first:
            self.wait_for_everyone()

    @contextmanager
    def main_process_first(self) -> Iterator[None]:
        with self._goes_first(self.is_main_process):
            yield

    @contextmanager
    def local_main_process_first(self) -> Iterator[None]:
        with self._goes_first(self.is_local_main_process):
            yield

    @contextmanager
    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> Iterator[Any]:
        """This rank's contiguous share of a list, tuple, dict of lists, or tensor."""
        yield _split(inputs, self.num_processes, self.process_index, apply_padding)

    def on_process(self, function: Callable | None = None, process_index: int | None = None) -> Callable:
        if function is None:
            return functools.partial(self.on_process, process_index=process_index)
        return _only_when(function, lambda: self.process_index == process_index)

    def on_local_process(
        self, function: Callable | None = None, local_process_index: int | None = None
    ) -> Callable:
        if function is None:
            return functools.partial(self.on_local_process, local_process_index=local_process_index)
        return _only_when(function, lambda: self.local_process_index == local_process_index)

    def on_main_process(self, function: Callable) -> Callable:
        return _only_when(function, lambda: self.is_main_process)

    def on_local_main_process(self, function: Callable) -> Callable:
        return _only_when(function, lambda: self.is_local_main_process)

    def on_last_process(self, function: Callable) -> Callable:
        return _only_when(function, lambda: self.is_last_process)

    def print(self, *args: Any, **kwargs: Any) -> None:
        if self.is_local_main_process:
            print(*args, **kwargs)

    def destroy_process_group(self, group: Any = None) -> None:
        """Destroy `group`, or the default group without aborting a peer (see `_runtime`)."""
        if not dist.is_initialized():
            return
        if group is None or group is dist.group.WORLD:
            _runtime.destroy_default_group()
        else:
            dist.destroy_process_group(group)

    def __repr__(self) -> str:
        return (
            f"Distributed environment: {self.distributed_type}{'  Backend: ' + str(self.backend) if self.backend else ''}\n"
            f"Num processes: {self.num_processes}\nProcess index: {self.process_index}\n"
            f"Local process index: {self.local_process_index}\nDevice: {self.device}\n"
        )


def _only_when(function: Callable, condition: Callable[[], bool]) -> Callable:
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return function(*args, **kwargs) if condition() else None

    return wrapper


def _split(inputs: Any, world: int, rank: int, apply_padding: bool) -> Any:
    if isinstance(inputs, dict):
        lengths = {len(v) for v in inputs.values()}
        if len(lengths) > 1:
            raise ValueError(
                f"split_between_processes needs dict values of one length, got lengths {sorted(lengths)}"
            )
        return {k: _split(v, world, rank, apply_padding) for k, v in inputs.items()}
    length = len(inputs)
    per_rank, extra = divmod(length, world)
    start = rank * per_rank + min(rank, extra)
    end = start + per_rank + (1 if rank < extra else 0)
    part = inputs[start:end]
    if apply_padding and extra and len(part) < math.ceil(length / world):
        pad_item = inputs[-1:]
        if isinstance(inputs, torch.Tensor):
            part = torch.cat([part, pad_item])
        else:
            part = part + pad_item
    return part


class AcceleratorState(PartialState):
    """`PartialState` plus what an `Accelerator` configured: precision, strategy, plugins."""

    def __init__(self, mixed_precision: str | None = None, cpu: bool = False, **kwargs: Any) -> None:
        super().__init__(
            cpu=cpu, **{k: v for k, v in kwargs.items() if k in ("backend", "init_method", "timeout")}
        )
        if (
            mixed_precision is not None
            and self._rt.accelerator_ready
            and mixed_precision != self.mixed_precision
        ):
            raise ValueError(
                f"AcceleratorState was already configured with mixed_precision={self.mixed_precision!r}; "
                f"cannot change it to {mixed_precision!r} (call accelerando.state.reset_runtime() in tests)"
            )

    @property
    def mixed_precision(self) -> str:
        return self._rt.mixed_precision

    @property
    def strategy(self) -> Any:
        return self._rt.strategy

    @property
    def fsdp_plugin(self) -> Any:
        return (
            getattr(self._rt.strategy, "plugin", None)
            if self.distributed_type == DistributedType.FSDP
            else None
        )

    @property
    def deepspeed_plugin(self) -> Any:
        """The selected DeepSpeed plugin (the one the next `prepare` builds engines with), or None."""
        return self._deepspeed_strategy().plugin if self._is_deepspeed else None

    @property
    def deepspeed_plugins(self) -> Any:
        """Every DeepSpeed plugin by name, or None without DeepSpeed."""
        return dict(self._deepspeed_strategy().plugins) if self._is_deepspeed else None

    def get_deepspeed_plugin(self, name: str) -> Any:
        plugins = self._deepspeed_strategy().plugins
        if name not in plugins:
            raise ValueError(f"no DeepSpeed plugin named {name!r}; the plugins are {', '.join(plugins)}")
        return plugins[name]

    def select_deepspeed_plugin(self, name: str | None = None) -> None:
        """Build the next prepared models' engines with plugin `name` (multi-model DeepSpeed)."""
        self._deepspeed_strategy().select(name)

    @property
    def _is_deepspeed(self) -> bool:
        return self._rt.strategy is not None and self.distributed_type == DistributedType.DEEPSPEED

    def _deepspeed_strategy(self) -> Any:
        if not self._is_deepspeed:
            raise ValueError(
                "this Accelerator does not use DeepSpeed: pass deepspeed_plugin(s)=... to Accelerator() or "
                "launch with --use_deepspeed"
            )
        return self._rt.strategy

    @property
    def is_fsdp2(self) -> bool:
        return self.distributed_type == DistributedType.FSDP

    @property
    def initialized(self) -> bool:
        return self._rt.accelerator_ready

    def __repr__(self) -> str:
        return super().__repr__() + f"Mixed precision type: {self.mixed_precision}\n"


class GradientState(_PicklesAsView):
    """Accumulation progress and the active data loader's end/remainder, for optimizers and metrics."""

    def _bind(self) -> Any:
        return _runtime.require_runtime().gradient

    @property
    def _g(self) -> Any:
        return self._bound_runtime()

    def __init__(self, gradient_accumulation_plugin: GradientAccumulationPlugin | None = None) -> None:
        self._bound = _runtime.require_runtime().gradient
        self._g.configured = True  # as Accelerate: a GradientState made is an initialised one
        if gradient_accumulation_plugin is not None:
            configure_gradient(self._g, gradient_accumulation_plugin)

    @staticmethod
    def _reset_state() -> None:
        """Accelerate's test hook: accumulation settings, progress and active loaders start afresh
        (views already made read the fresh state, as Accelerate's shared dict would be refilled)."""
        runtime = _runtime.current()
        if runtime is not None:
            runtime.gradient.stale = True
            runtime.gradient = _runtime.GradientRuntime()

    @property
    def initialized(self) -> bool:
        return self._g.configured

    @property
    def num_steps(self) -> int:
        return self._g.num_steps

    @property
    def adjust_scheduler(self) -> bool:
        return self._g.adjust_scheduler

    @property
    def sync_with_dataloader(self) -> bool:
        return self._g.sync_with_dataloader

    @property
    def sync_each_batch(self) -> bool:
        return self._g.sync_each_batch

    @property
    def plugin_kwargs(self) -> dict[str, Any]:
        g = self._g
        return {
            "num_steps": g.num_steps,
            "adjust_scheduler": g.adjust_scheduler,
            "sync_with_dataloader": g.sync_with_dataloader,
            "sync_each_batch": g.sync_each_batch,
        }

    @property
    def sync_gradients(self) -> bool:
        return self._g.sync_gradients

    def _set_sync_gradients(self, sync_gradients: bool) -> None:
        self._g.sync_gradients = sync_gradients

    @property
    def active_dataloader(self) -> Any:
        return self._g.dataloaders[-1] if self._g.dataloaders else None

    @property
    def dataloader_references(self) -> list[Any]:
        return list(self._g.dataloaders)

    @property
    def in_dataloader(self) -> bool:
        return bool(self._g.dataloaders)

    @property
    def end_of_dataloader(self) -> bool:
        loader = self.active_dataloader
        return bool(getattr(loader, "end_of_dataloader", False)) if loader is not None else False

    @property
    def remainder(self) -> int:
        loader = self.active_dataloader
        return int(getattr(loader, "remainder", -1)) if loader is not None else -1

    def _add_dataloader(self, dataloader: Any) -> None:
        self._g.dataloaders.append(dataloader)

    def _remove_dataloader(self, dataloader: Any) -> None:
        if dataloader in self._g.dataloaders:
            self._g.dataloaders.remove(dataloader)

    def __repr__(self) -> str:
        return f"GradientState(sync_gradients={self.sync_gradients}, num_steps={self.num_steps})"


def configure_gradient(g: _runtime.GradientRuntime, plugin: GradientAccumulationPlugin) -> None:
    steps = 1 if plugin.num_steps is None else plugin.num_steps
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ValueError(f"gradient_accumulation_steps must be an integer >= 1, got {plugin.num_steps!r}")
    g.num_steps = steps
    g.adjust_scheduler = plugin.adjust_scheduler
    g.sync_with_dataloader = plugin.sync_with_dataloader
    g.sync_each_batch = plugin.sync_each_batch
    g.configured = True
