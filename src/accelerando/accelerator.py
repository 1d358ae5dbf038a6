"""The `Accelerator` facade: turns Accelerate-style arguments into one resolved configuration and
forwards every call to a component (runtime, strategy, precision, data, collectives, checkpoint).
"""

from __future__ import annotations

import contextlib
import gc
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from accelerando import _prepare, _runtime
from accelerando._accumulation import advance_window
from accelerando._config_views import ConfigViews
from accelerando._mesh_views import MeshViews
from accelerando.checkpoint.objects import TrainingObjects
from accelerando.config import env
from accelerando.config.options import (
    AutocastKwargs,
    DataLoaderConfiguration,
    GradientAccumulationPlugin,
    ProjectConfiguration,
    TorchDynamoPlugin,
)
from accelerando.config.resolve import ResolvedConfig, fold_old_arguments, resolve
from accelerando.ops import collectives
from accelerando.ops.tree import is_tensor_tree, recursively_apply
from accelerando.optimizer import AcceleratedOptimizer
from accelerando.scheduler import AcceleratedScheduler
from accelerando.state import AcceleratorState, GradientState, configure_gradient
from accelerando.strategies import PrepareRequest
from accelerando.strategies.resolve import plan_strategy, running_deepspeed, set_up_strategy
from accelerando.tracking.session import TrackingSession


def _from_state(name: str) -> Any:
    """A read-only property answered by `self.state` (the PartialState view of the runtime)."""
    return property(lambda self: getattr(self.state, name), doc=f"Same as `PartialState.{name}`.")


def _state_method(name: str) -> Any:
    """A method forwarded to `self.state`, documented there."""

    def forward(self: Accelerator, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.state, name)(*args, **kwargs)

    forward.__name__ = name
    forward.__doc__ = f"Same as `PartialState.{name}`."
    return forward


class Accelerator(ConfigViews, MeshViews):
    """Run one training script on any device count: see docs/ and `../shared/reference/API.md`."""

    def __init__(
        self,
        device_placement: bool = True,
        mixed_precision: str | None = None,
        gradient_accumulation_steps: int = 1,
        cpu: bool = False,
        dataloader_config: DataLoaderConfiguration | None = None,
        deepspeed_plugin: Any = None,
        fsdp_plugin: Any = None,
        rng_types: list[Any] | None = None,
        log_with: Any = None,
        project_dir: str | None = None,
        project_config: ProjectConfiguration | None = None,
        gradient_accumulation_plugin: GradientAccumulationPlugin | None = None,
        step_scheduler_with_optimizer: bool = True,
        kwargs_handlers: list[Any] | None = None,
        dynamo_backend: Any = None,
        dynamo_plugin: TorchDynamoPlugin | None = None,
        deepspeed_plugins: Any = None,
        parallelism_config: Any = None,
        **old: Any,  # Accelerate's moved and deprecated keywords
    ) -> None:
        dataloader_config, parallelism_config = fold_old_arguments(old, dataloader_config, parallelism_config)
        settings = env.read_settings()
        self.config: ResolvedConfig = resolve(
            cpu=cpu,
            mixed_precision=mixed_precision
            if mixed_precision is not None
            else _runtime.configured_precision(),
            gradient_accumulation_steps=gradient_accumulation_steps,
            gradient_accumulation_plugin=gradient_accumulation_plugin,
            dataloader_config=dataloader_config,
            project_dir=project_dir,
            project_config=project_config,
            kwargs_handlers=kwargs_handlers,
            dynamo_backend=dynamo_backend,
            dynamo_plugin=dynamo_plugin,
            device_placement=device_placement,
            step_scheduler_with_optimizer=step_scheduler_with_optimizer,
            rng_types=rng_types,
            fsdp_plugin=fsdp_plugin,
            deepspeed_plugins=(deepspeed_plugin, deepspeed_plugins),
            settings=settings,
            parallelism_config=parallelism_config,
        )
        plan_strategy(self.config, _runtime.planned_topology())  # bad mesh sizes fail before any group work
        self._runtime = _runtime.init_runtime(cpu=self.config.cpu, init_kwargs=self.config.handlers.init)
        self._setup_components(joins=deepspeed_plugin is None and deepspeed_plugins is None)
        self.state = AcceleratorState()
        self.gradient_state = GradientState()
        self._objects = TrainingObjects(
            gradient=self._runtime.gradient, device_kind=self._runtime.device_kind
        )
        self._tracking = TrackingSession(log_with, self.logging_dir, self._objects, self.is_main_process)
        self._checkpointer_instance: Any = None
        self.flag_tensor: torch.Tensor | None = None

    def _setup_components(self, joins: bool = False) -> None:
        rt, cfg = self._runtime, self.config
        if rt.accelerator_ready and rt.mixed_precision != cfg.mixed_precision:
            raise ValueError(
                f"this process already has an Accelerator with mixed_precision={rt.mixed_precision!r}; "
                f"a second one cannot use {cfg.mixed_precision!r} (call accelerando.state.reset_runtime() in tests)"
            )
        strategy = (joins and running_deepspeed(rt)) or set_up_strategy(cfg, rt)
        rt.precision, rt.strategy, rt.mixed_precision = strategy.ctx.precision, strategy, cfg.mixed_precision
        configure_gradient(rt.gradient, cfg.gradient)
        rt.gradient.window_size = rt.gradient.num_steps
        rt.gradient.step_in_window = 0
        rt.gradient.sync_gradients = True
        rt.accelerator_ready = True

    # ---- components ------------------------------------------------------------------------
    @property
    def strategy(self) -> Any:
        runtime = self._runtime
        if runtime.stale and _runtime.current() is None:  # AcceleratorState._reset_state() was called
            raise _runtime.reset_error("AcceleratorState", "strategy")
        return runtime.strategy

    @property
    def precision(self) -> Any:
        return self._runtime.precision

    # ---- what was prepared: the registry the checkpointer reads ------------------------------
    @property
    def step(self) -> int:
        """Micro-batches since the last optimizer step (saved and restored by checkpoints)."""
        return self._objects.step

    @step.setter
    def step(self, value: int) -> None:
        self._objects.step = value

    @property
    def _models(self) -> list[torch.nn.Module]:
        return self._objects.models

    @property
    def _optimizers(self) -> list[AcceleratedOptimizer]:
        return self._objects.optimizers

    @property
    def _schedulers(self) -> list[AcceleratedScheduler]:
        return self._objects.schedulers

    @property
    def _dataloaders(self) -> list[Any]:
        return self._objects.dataloaders

    @property
    def _custom_objects(self) -> list[Any]:
        return self._objects.custom

    # ---- process placement and control: the state view answers ------------------------------
    device = _from_state("device")
    distributed_type = _from_state("distributed_type")
    num_processes = _from_state("num_processes")
    process_index = _from_state("process_index")
    local_process_index = _from_state("local_process_index")
    is_main_process = _from_state("is_main_process")
    is_local_main_process = _from_state("is_local_main_process")
    is_last_process = _from_state("is_last_process")
    use_distributed = _from_state("use_distributed")
    is_fsdp2 = _from_state("is_fsdp2")
    deepspeed_plugin = _from_state("deepspeed_plugin")
    deepspeed_engine_wrapped = property(lambda self: self.strategy.engine_wrapped)  # DeepSpeed: first engine
    wait_for_everyone = _state_method("wait_for_everyone")
    main_process_first = _state_method("main_process_first")
    local_main_process_first = _state_method("local_main_process_first")
    split_between_processes = _state_method("split_between_processes")
    on_main_process = _state_method("on_main_process")
    on_local_main_process = _state_method("on_local_main_process")
    on_last_process = _state_method("on_last_process")
    on_process = _state_method("on_process")
    on_local_process = _state_method("on_local_process")
    print = _state_method("print")

    @property
    def multi_device(self) -> bool:
        return self.use_distributed and self.device.type != "cpu"

    @property
    def mixed_precision(self) -> str:
        return self._runtime.mixed_precision

    @property
    def data_parallel_rank(self) -> int:
        return self.strategy.data_parallel_rank

    @property
    def data_parallel_size(self) -> int:
        return self.strategy.data_parallel_size

    @property
    def scaler(self) -> Any:
        return self.precision.scaler

    @property
    def native_amp(self) -> bool:
        return self.mixed_precision in ("fp16", "bf16")

    # ---- prepare ---------------------------------------------------------------------------
    def prepare(self, *args: Any, device_placement: list[bool] | None = None) -> Any:
        """Prepare models, optimizers, schedulers and data loaders in any order; same order back."""
        if device_placement is None:
            device_placement = [self.device_placement] * len(args)
        elif len(device_placement) != len(args):
            raise ValueError(
                f"device_placement has {len(device_placement)} entries for {len(args)} objects; give one per object"
            )
        kinds = [_prepare.kind_of(a) for a in args]
        result = list(args)
        for i, kind in enumerate(kinds):  # loaders first: the strategy is told their batch sizes
            if kind == _prepare.DATALOADER:
                result[i] = self.prepare_data_loader(args[i], device_placement=device_placement[i])
            elif _prepare.is_prepared(args[i]):  # prepared before: registered once, never re-wrapped
                _prepare.register_once(self._registry_of(kind), args[i])
                kinds[i] = _prepare.OTHER
        index = {k: [i for i, kind in enumerate(kinds) if kind == k] for k in _prepare.KINDS}
        prepared = self.strategy.prepare(
            PrepareRequest(
                models=[args[i] for i in index[_prepare.MODEL]],
                optimizers=[args[i] for i in index[_prepare.OPTIMIZER]],
                schedulers=[args[i] for i in index[_prepare.SCHEDULER]],
                batch_sizes=[
                    _prepare.micro_batch_size(dl, self.data_parallel_size) for dl in self._dataloaders
                ],
                device_placement=[device_placement[i] for i in index[_prepare.MODEL]],
                dynamo=self.config.dynamo,
            )
        )
        for i, model in zip(index[_prepare.MODEL], prepared.models):
            result[i] = _prepare.register_once(self._models, _prepare.mark_prepared(model))
        for i, opt in zip(index[_prepare.OPTIMIZER], prepared.optimizers):
            result[i] = self._wrap_optimizer(opt, device_placement[i])
        for i, scheduler in zip(index[_prepare.SCHEDULER], prepared.schedulers):
            result[i] = self.prepare_scheduler(scheduler)
        return result[0] if len(result) == 1 else tuple(result)

    def _registry_of(self, kind: str) -> list[Any]:
        registries: list[list[Any]] = [self._models, self._optimizers, self._schedulers]
        return dict(zip((_prepare.MODEL, _prepare.OPTIMIZER, _prepare.SCHEDULER), registries)).get(kind, [])

    def prepare_model(
        self, model: torch.nn.Module, device_placement: bool | None = None, evaluation_mode: bool = False
    ) -> torch.nn.Module:
        if _prepare.is_prepared(model):
            return _prepare.register_once(self._models, model)
        placement = self.device_placement if device_placement is None else device_placement
        request = PrepareRequest(
            models=[model],
            device_placement=[placement],
            dynamo=self.config.dynamo,
            evaluation_mode=evaluation_mode,
        )
        (wrapped,) = self.strategy.prepare(request).models
        return _prepare.register_once(self._models, _prepare.mark_prepared(wrapped))

    def _wrap_optimizer(self, optimizer: torch.optim.Optimizer, placement: bool) -> AcceleratedOptimizer:
        if isinstance(optimizer, AcceleratedOptimizer) or _prepare.is_prepared(optimizer):
            return _prepare.register_once(self._optimizers, optimizer)
        wrapped = AcceleratedOptimizer(optimizer, device_placement=placement, scaler=self.precision.scaler)
        return _prepare.register_once(self._optimizers, _prepare.mark_prepared(wrapped))

    def prepare_optimizer(
        self, optimizer: torch.optim.Optimizer, device_placement: bool | None = None
    ) -> Any:
        placement = self.device_placement if device_placement is None else device_placement
        return self._wrap_optimizer(optimizer, placement)

    def prepare_scheduler(self, scheduler: Any) -> AcceleratedScheduler:
        if _prepare.is_prepared(scheduler):
            return _prepare.register_once(self._schedulers, scheduler)  # type: ignore[no-any-return]
        target = getattr(scheduler, "optimizer", None)
        optimizers = [o for o in self._optimizers if o is target or o.optimizer is target] or self._optimizers
        wrapped = AcceleratedScheduler(
            scheduler,
            optimizers,
            step_with_optimizer=self.step_scheduler_with_optimizer,
            split_batches=self.split_batches,
        )
        return _prepare.register_once(self._schedulers, _prepare.mark_prepared(wrapped))  # type: ignore[no-any-return]

    def prepare_data_loader(
        self, data_loader: Any, device_placement: bool | None = None, slice_fn_for_dispatch: Any = None
    ) -> Any:
        from accelerando.data import prepare_data_loader

        if _prepare.is_prepared(data_loader):
            return _prepare.register_once(self._dataloaders, data_loader)
        prepared = prepare_data_loader(
            data_loader,
            num_processes=self.data_parallel_size,
            process_index=self.data_parallel_rank,
            device=self.device,
            config=self.config.dataloader,
            gradient_state=self.gradient_state,
            put_on_device=self.device_placement if device_placement is None else device_placement,
            rng_types=list(self.config.rng_types),
            slice_fn_for_dispatch=slice_fn_for_dispatch,
        )
        return _prepare.register_once(self._dataloaders, _prepare.mark_prepared(prepared))

    def skip_first_batches(self, dataloader: Any, num_batches: int = 0) -> Any:
        from accelerando.data import skip_first_batches

        return skip_first_batches(dataloader, num_batches=num_batches)

    # ---- training step ---------------------------------------------------------------------
    @property
    def sync_gradients(self) -> bool:
        return self._runtime.gradient.sync_gradients

    @sync_gradients.setter
    def sync_gradients(self, value: bool) -> None:
        self._runtime.gradient.sync_gradients = value

    @property
    def gradient_accumulation_steps(self) -> int:
        return self._runtime.gradient.num_steps

    @gradient_accumulation_steps.setter
    def gradient_accumulation_steps(self, value: int) -> None:
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"gradient_accumulation_steps must be an integer >= 1, got {value!r}")
        self._runtime.gradient.num_steps = value
        self._runtime.gradient.window_size = value

    def _do_sync(self) -> None:
        """Decide whether this micro-batch ends an accumulation window (see docs/accumulation.md)."""
        self.step += 1
        g = self._runtime.gradient
        if advance_window(g, g.dataloaders[-1] if g.dataloaders else None):
            self.step = 0

    @contextlib.contextmanager
    def accumulate(self, *models: torch.nn.Module) -> Iterator[None]:
        """One micro-batch: gradients sync and optimizers step only at the end of a window.

        Runs on every step: no device reads, and no context entered on a syncing step.
        """
        self._do_sync()
        g = self._runtime.gradient
        if g.sync_gradients or g.sync_each_batch or not models:
            yield  # the common, syncing step: no context to enter
            return
        if len(models) == 1:
            with self.no_sync(models[0]):
                yield
            return
        with contextlib.ExitStack() as stack:
            for model in models:
                stack.enter_context(self.no_sync(model))
            yield

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[None]:
        """The strategy's context in which `model`'s backward does not synchronise gradients."""
        return self.strategy.no_sync(model)

    def trigger_sync_in_backward(self, model: torch.nn.Module) -> contextlib.AbstractContextManager:
        """Make the next backward synchronise gradients even after forwards under `no_sync`."""
        return self.strategy.sync_in_backward(model)

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """Scale the loss for accumulation and precision, then run the strategy's backward."""
        strategy, window = self.strategy, self._runtime.gradient.window_size
        if window > 1 and not strategy.capabilities.owns_gradient_accumulation:
            loss = loss / window
        strategy.backward(loss, **kwargs)

    def unscale_gradients(self, optimizer: Any = None) -> None:
        optimizers = (
            optimizer
            if isinstance(optimizer, (list, tuple))
            else [optimizer]
            if optimizer
            else self._optimizers
        )
        for opt in optimizers:
            self.precision.unscale_(opt.optimizer if isinstance(opt, AcceleratedOptimizer) else opt)

    def clip_grad_norm_(
        self, parameters: Iterable[Any], max_norm: float, norm_type: float = 2
    ) -> torch.Tensor:
        """Clip the accumulated gradients; on a non-boundary micro-step only measure them."""
        params = list(parameters)
        if not self.sync_gradients:
            return self.strategy.clip_grad_norm_(params, float("inf"), norm_type)
        self.unscale_gradients()
        return self.strategy.clip_grad_norm_(params, max_norm, norm_type)

    def clip_grad_value_(self, parameters: Iterable[Any], clip_value: float) -> None:
        if self.sync_gradients:
            self.unscale_gradients()
            self.strategy.clip_grad_value_(list(parameters), clip_value)

    @property
    def optimizer_step_was_skipped(self) -> bool:
        return any(opt.step_was_skipped for opt in self._optimizers)

    @contextlib.contextmanager
    def autocast(self, autocast_handler: AutocastKwargs | None = None) -> Iterator[None]:
        handler = autocast_handler or self.autocast_handler
        with self.precision.autocast(enabled=handler.enabled, cache_enabled=handler.cache_enabled):
            yield

    def unwrap_model(
        self, model: torch.nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True
    ) -> torch.nn.Module:
        from accelerando.utils.other import unwrap

        return unwrap(model, self.strategy, keep_fp32_wrapper, keep_torch_compile)

    @contextlib.contextmanager
    def profile(self, profile_handler: Any = None) -> Iterator[Any]:
        """`torch.profiler.profile` configured by `ProfileKwargs` (argument, else kwargs_handlers)."""
        from accelerando.profiling import profile

        handler = profile_handler or self.profile_handler
        with profile(handler, self.process_index) as prof:
            yield prof
        if handler is not None and handler.output_trace_dir:
            self.wait_for_everyone()  # every rank's trace is on disk when any rank goes on

    # ---- collectives -----------------------------------------------------------------------
    def gather(self, tensor: Any) -> Any:
        return collectives.gather(tensor)

    def gather_for_metrics(self, input_data: Any, use_gather_object: bool = False, group: Any = None) -> Any:
        """Gather over the data-parallel ranks (or `group`), then drop the samples that even_batches
        duplicated to pad the last batch."""
        leaves_are_tensors = is_tensor_tree(input_data)
        if use_gather_object or not leaves_are_tensors:
            data = collectives.gather_object(input_data, group=group)
        else:
            data = collectives.gather(input_data, group=group)
        if not self.gradient_state.end_of_dataloader:
            return data
        remainder = self.gradient_state.remainder
        if remainder <= 0:
            return data
        if isinstance(data, list) and (use_gather_object or not leaves_are_tensors):
            return data[:remainder]
        return recursively_apply(lambda t: t[:remainder], data)

    def reduce(self, tensor: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
        return collectives.reduce(tensor, reduction=reduction, scale=scale)

    def pad_across_processes(
        self, tensor: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False
    ) -> Any:
        return collectives.pad_across_processes(tensor, dim=dim, pad_index=pad_index, pad_first=pad_first)

    def set_trigger(self) -> None:
        self.flag_tensor = torch.tensor(1, device=self.device)

    def check_trigger(self) -> bool:
        """True on every rank when any rank called `set_trigger` since the last check."""
        flag = self.flag_tensor if self.flag_tensor is not None else torch.tensor(0, device=self.device)
        if collectives.reduce(flag, reduction="sum").item() >= 1:
            self.flag_tensor = torch.tensor(0, device=self.device)
            return True
        return False

    @contextlib.contextmanager
    def join_uneven_inputs(self, joinables: list[Any], even_batches: bool | None = None) -> Iterator[None]:
        """Let ranks run different numbers of steps (the strategy's join), optionally with even_batches overridden."""
        loaders = [dl for dl in self._dataloaders if hasattr(dl, "even_batches")]
        if even_batches is not None and _prepare.drop_iterable(loaders):
            warnings.warn(
                "Overriding even_batches is only supported for map-style datasets, yet some dataloaders "
                "given were iterable (they keep their own even_batches)",
                stacklevel=3,
            )
        saved = [dl.even_batches for dl in loaders]
        if even_batches is not None:
            for dl in loaders:
                dl.even_batches = even_batches
        try:
            with self.strategy.join_context(joinables):
                yield
        finally:
            for dl, value in zip(loaders, saved):
                dl.even_batches = value

    # ---- lifecycle -------------------------------------------------------------------------
    def free_memory(self, *objects: Any) -> list[Any]:
        self.strategy.teardown()
        self._objects.clear()
        gc.collect()
        if self.device.type != "cpu":
            self._runtime.device_kind.empty_cache()
        return [None] * len(objects)

    clear = free_memory

    def end_training(self) -> None:
        """Tear the process group down together, then finish this rank's trackers (no rank waits on
        another's); a tracker that failed, here or in `log`, raises TrackerError."""
        self._checkpointer().wait()  # a pending asynchronous save finishes (or raises) first
        self.wait_for_everyone()
        self.state.destroy_process_group()
        if (error := self._tracking.finish()) is not None:
            raise error

    # ---- experiment tracking: accelerando.tracking does the work ---------------------------
    @property
    def log_with(self) -> list[Any]:
        return self._tracking.log_with

    @property
    def trackers(self) -> list[Any]:
        return self._tracking.trackers

    def init_trackers(self, project_name: str, config: Any = None, init_kwargs: dict | None = None) -> None:
        """Build every `log_with` tracker; the main process starts its runs and stores `config`."""
        self._tracking.init(project_name, config, init_kwargs)

    def log(self, values: dict, step: int | None = None, log_kwargs: dict | None = None) -> None:
        """Log `values` at `step`, or at the next step of a counter that checkpoints carry."""
        self._tracking.log(values, step, log_kwargs)

    def get_tracker(self, name: str, unwrap: bool = False) -> Any:
        """The tracker named `name` (its SDK run with `unwrap=True`; an inert one off the main process)."""
        return self._tracking.get(name, unwrap)

    # ---- checkpoints: accelerando.checkpoint does the work ----------------------------------
    def _checkpointer(self) -> Any:
        from accelerando.checkpoint.manager import Checkpointer

        if getattr(self, "_checkpointer_instance", None) is None:
            self._checkpointer_instance = Checkpointer(
                self._objects, self.strategy, self.project_configuration
            )
        return self._checkpointer_instance

    def save_state(
        self, output_dir: str | None = None, safe_serialization: bool = True, **kwargs: Any
    ) -> str:
        return self._checkpointer().save_state(output_dir, safe_serialization=safe_serialization, **kwargs)

    def load_state(self, input_dir: str | None = None, **kwargs: Any) -> str:
        return self._checkpointer().load_state(input_dir, **kwargs)

    def save_model(
        self,
        model: torch.nn.Module,
        save_directory: str,
        max_shard_size: int | str = "10GB",
        safe_serialization: bool = True,
    ) -> None:
        self._checkpointer().save_model(model, save_directory, max_shard_size, safe_serialization)

    def save(self, obj: Any, f: Any, safe_serialization: bool = False) -> None:
        self._checkpointer().save(obj, f, safe_serialization=safe_serialization)

    def get_state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict[str, Any]:
        return self._checkpointer().get_state_dict(model, unwrap=unwrap)

    def register_save_state_pre_hook(self, hook: Callable) -> Any:
        return self._checkpointer().register_save_state_pre_hook(hook)

    def register_load_state_pre_hook(self, hook: Callable) -> Any:
        return self._checkpointer().register_load_state_pre_hook(hook)

    def register_for_checkpointing(self, *objects: Any) -> None:
        bad = [
            f"\n\t- Item at index {i}, `{type(o).__name__}`"
            for i, o in enumerate(objects)
            if not (hasattr(o, "state_dict") and hasattr(o, "load_state_dict"))
        ]
        if bad:
            raise ValueError(
                "All `objects` must include a `state_dict` and `load_state_dict` function to be stored. "
                "The following inputs are invalid:" + "".join(bad)
            )
        self._custom_objects.extend(objects)

    def __repr__(self) -> str:
        return f"Accelerator(\n{self.state!r})"
