"""DeepSpeed ZeRO 0-3 as a Strategy: one `deepspeed.initialize` engine per prepared model.

Several plugins (`deepspeed_plugins={"student": ..., "teacher": ...}`) give several kinds of engine
in one Accelerator; each `prepare` builds its models' engines with the plugin selected then. Every
call that concerns one model (backward, clip, step, state) goes to that model's engine.

The training step keeps Accelerate's loop: `backward` runs `engine.backward` with the boundary of
the Accelerator's accumulation window (the loss already divided by the window's length, as for DDP),
and the engine steps once per window: in `clip_grad_norm_` (so `max_norm` is the clipping of that
very step and the pre-clip norm is returned) or else in `optimizer.step()`. The engines use the
process group the runtime created (a one-rank group is made for a single process); on CPU the
JIT-built shared-memory collective is switched off, so gloo carries everything.
"""

from __future__ import annotations

import atexit
import contextlib
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from accelerando import _runtime
from accelerando.cluster.base import ProcessTopology
from accelerando.config import env
from accelerando.config.deepspeed import DeepSpeedPlugin
from accelerando.config.options import DistributedType, DynamoBackend
from accelerando.parallel.mesh import MeshShape
from accelerando.precision.base import Precision
from accelerando.strategies import compose
from accelerando.strategies.base import Prepared, PrepareRequest, Strategy, StrategyContext
from accelerando.strategies.deepspeed_config import (
    EngineRequest,
    engine_config,
    is_dummy,
    optimizer_for_engine,
)
from accelerando.utils.deepspeed import (
    DeepSpeedEngineWrapper,
    DeepSpeedOptimizerWrapper,
    DeepSpeedSchedulerWrapper,
)

if TYPE_CHECKING:
    from accelerando.checkpoint.state_io import StateIO
    from accelerando.config.resolve import ResolvedConfig


class EnginePrecision(Precision):
    """The engine casts, scales and unscales itself: the facade's precision hooks do nothing, except
    an fp8 backend's, which runs inside the bf16 engine: its layer conversion and forward context."""

    def __init__(self, precision: Precision) -> None:
        self.name = precision.name
        self.compute_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}.get(
            self.name
        )
        self.fp8 = precision if precision.name == "fp8" else None
        self.backend = precision.backend
        self.replaces_parameters = precision.replaces_parameters

    @property
    def wraps_forward(self) -> bool:
        return self.fp8 is not None

    def convert_module(self, model: torch.nn.Module) -> torch.nn.Module:
        return self.fp8.convert_module(model) if self.fp8 is not None else model

    def forward_context(self, model: torch.nn.Module) -> contextlib.AbstractContextManager:
        return self.fp8.forward_context(model) if self.fp8 is not None else contextlib.nullcontext()

    def autocast(
        self, enabled: bool = True, cache_enabled: bool | None = None
    ) -> contextlib.AbstractContextManager:
        return self.fp8.autocast(enabled, cache_enabled) if self.fp8 is not None else contextlib.nullcontext()


@dataclass
class Engine:
    """One prepared model's engine and its step state within the current accumulation window."""

    engine: Any
    plugin_name: str
    clip: float  # the config's gradient_clipping (0: clip only when clip_grad_norm_ asks)
    trainable: bool  # built with an optimizer (an inference engine has none)
    needs_step: bool = False  # a boundary backward ran and the engine has not stepped since
    last_norm: Any = None  # as the engine gave it: read when clip_grad_norm_ asks, no sync per step

    @property
    def stage(self) -> int:
        return int(self.engine.zero_optimization_stage())


class DeepSpeedStrategy(Strategy):
    name = "deepspeed"

    def __init__(
        self, ctx: StrategyContext, plugins: dict[str, DeepSpeedPlugin], split_batches: bool = False
    ) -> None:
        super().__init__(ctx)
        self.plugins = plugins
        self.active = next(iter(plugins))
        self.split_batches = split_batches
        self.engines: list[Engine] = []
        self._by_id: dict[int, Engine] = {}  # id(engine), id(module), id(optimizer), id(parameter)
        # Accelerate's `accelerator.deepspeed_engine_wrapped`: the first engine prepared (backward here
        # finds each loss's own engine, so later ones need no warning that backward ignores them)
        self.engine_wrapped: DeepSpeedEngineWrapper | None = None

    @classmethod
    def options(cls, config: ResolvedConfig) -> dict[str, Any]:
        if not config.deepspeed_plugins:
            raise ValueError("the DeepSpeed strategy needs deepspeed_plugin(s) or --use_deepspeed")
        return {"plugins": config.deepspeed_plugins, "split_batches": config.dataloader.split_batches}

    @classmethod
    def mesh_shape(cls, topology: ProcessTopology, **options: Any) -> MeshShape:
        return MeshShape.resolve(topology.world_size, dp_shard=-1)  # ZeRO partitions over every rank

    @classmethod
    def adopt_mesh_shape(cls, shape: MeshShape, **options: Any) -> MeshShape:
        """ZeRO partitions over every rank; tensor and context parallelism are not run under DeepSpeed."""
        if shape.tp > 1 or shape.cp > 1:
            raise ValueError(
                f"ParallelismConfig tp_size={shape.tp}, cp_size={shape.cp}: tensor and context parallelism "
                "are not available with DeepSpeed in accelerando; use FSDP (fsdp_plugin) or tp_size=cp_size=1"
            )
        return MeshShape.resolve(shape.world_size, dp_shard=-1)

    @classmethod
    def adapt_precision(cls, precision: Precision) -> Precision:
        return EnginePrecision(precision)

    @property
    def distributed_type(self) -> DistributedType:
        return DistributedType.DEEPSPEED

    # ---- plugins ----------------------------------------------------------------------------
    @property
    def plugin(self) -> DeepSpeedPlugin:
        return self.plugins[self.active]

    def select(self, name: str | None = None) -> None:
        """Make `name` the plugin the next `prepare` builds engines with (transformers' zero.Init follows)."""
        name = self.active if name is None else name
        if name not in self.plugins:
            raise ValueError(f"no DeepSpeed plugin named {name!r}; the plugins are {', '.join(self.plugins)}")
        for plugin in self.plugins.values():
            plugin._unselect()
        self.active = name
        self.plugins[name].select(_from_accelerator_state=True)

    # ---- process group ----------------------------------------------------------------------
    def setup_environment(self) -> None:
        try:
            import deepspeed
        except ImportError as err:
            raise ImportError(
                "DeepSpeed is not installed: DS_BUILD_OPS=0 pip install 'accelerando[deepspeed]'"
            ) from err
        from deepspeed import comm

        device = self.ctx.device
        if device.type == "cpu":
            _use_cpu_accelerator()
            # Its first use JIT-compiles a C++ op (~100 s); plain gloo collectives do the same job here.
            deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        if not dist.is_initialized():
            _one_process_group(device)
        _forget_destroyed_groups()
        if env.raw("LOCAL_RANK") is None:  # DeepSpeed's engine asserts it; `python train.py` has none
            env.export({"LOCAL_RANK": str(self.ctx.topology.local_rank)})
        comm.init_distributed(dist_backend=dist.get_backend(), dist_init_required=False, verbose=False)
        if comm.get_world_size() != self.ctx.world_size:
            raise RuntimeError(
                f"DeepSpeed sees {comm.get_world_size()} processes but the job has {self.ctx.world_size}"
            )
        self.select(self.active)

    # ---- prepare ----------------------------------------------------------------------------
    def prepare(self, request: PrepareRequest) -> Prepared:
        """Pair optimizers and schedulers with their models, compute every engine's config (refusing
        contradictions before anything is built), then build the engines in order. The engines'
        optimizers and engine-owned schedulers come back in Accelerate's wrappers."""
        import deepspeed

        from accelerando._prepare import mark_prepared

        pairs = _pair(request)
        accumulation = _runtime.require_runtime().gradient.num_steps
        configs = [
            engine_config(
                self.plugin,
                pair,
                batch_sizes=request.batch_sizes,
                accumulation=accumulation,
                world_size=self.ctx.world_size,
                split_batches=self.split_batches,
            )
            for pair in pairs
        ]
        replaced: dict[int, Any] = {}
        models = []
        for i, (pair, config) in enumerate(zip(pairs, configs)):
            names = compose.parameter_names([pair.model])
            module = self.prepare_model(
                pair.model, place=request.placement(i), dynamo=None, evaluation_mode=request.evaluation_mode
            )
            if pair.optimizer is not None and not is_dummy(pair.optimizer, "optimizer"):
                self.rebind_optimizers([pair.optimizer], names, [module])  # fp8 layers that replaced theirs
            _set_moe_leaf_modules(module, self.plugin.transformer_moe_cls_names)
            kwargs: dict[str, Any] = {"model": module, "config": config, "dist_init_required": False}
            if is_dummy(pair.optimizer, "optimizer"):
                kwargs["model_parameters"] = pair.optimizer.params
                if is_dummy(pair.scheduler, "scheduler") and pair.scheduler.lr_scheduler_callable is not None:
                    kwargs["lr_scheduler"] = pair.scheduler.lr_scheduler_callable
            elif pair.optimizer is not None:
                kwargs["optimizer"] = optimizer_for_engine(pair.optimizer, config)
            engine, optimizer, _, _ = deepspeed.initialize(**kwargs)
            if request.dynamo.backend != DynamoBackend.NO:
                compile_kwargs = request.dynamo.to_kwargs()
                engine.compile(backend=compile_kwargs.pop("backend"), compile_kwargs=compile_kwargs)
            self._register(engine, float(config["gradient_clipping"]), trainable=pair.optimizer is not None)
            models.append(engine)
            if pair.optimizer is not None:
                optimizer = replaced[id(pair.optimizer)] = mark_prepared(DeepSpeedOptimizerWrapper(optimizer))
            if is_dummy(pair.scheduler, "scheduler"):
                wrapped = DeepSpeedSchedulerWrapper(engine.lr_scheduler, [optimizer])
                replaced[id(pair.scheduler)] = mark_prepared(wrapped)
        return Prepared(
            models,
            [replaced[id(o)] for o in request.optimizers],
            [replaced.get(id(s), s) for s in request.schedulers],
        )

    def check_model(self, model: torch.nn.Module) -> None:
        compose.refuse_multi_device_map(model)

    def _register(self, engine: Any, clip: float, *, trainable: bool) -> None:
        record = Engine(engine, self.active, clip, trainable)
        if not hasattr(engine.optimizer, "clip_grad") and record.trainable:
            engine._config.gradient_clipping = 0.0  # a plain torch optimizer: clip_grad_norm_ clips it here
        self.engines.append(record)
        if self.engine_wrapped is None:
            self.engine_wrapped = DeepSpeedEngineWrapper(engine)
        keys = [engine, engine.module, *engine.module.parameters()]
        if engine.optimizer is not None:
            keys.append(engine.optimizer)
        for key in keys:
            self._by_id[id(key)] = record

    def record(self, obj: Any) -> Engine:
        """The engine of a prepared model (the engine or its module), optimizer or parameter."""
        found = self._by_id.get(id(obj))
        if found is None:
            raise ValueError(
                f"this {type(obj).__name__} belongs to no DeepSpeed engine of this Accelerator; prepare each "
                "model together with its optimizer (and scheduler) in one prepare() call"
            )
        return found

    # ---- training step ----------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, model: torch.nn.Module | None = None, **kwargs: Any) -> None:
        """`engine.backward`; the engine steps later, in `clip_grad_norm_` or `optimizer.step()`.

        The facade has divided the loss by the window's length. `scale_wrt_gas=False` (what
        transformers' Trainer passes) says the caller divided it already: that division is undone,
        so the loss is divided once, as in Accelerate (exactly for power-of-two windows)."""
        record = self.record(model) if model is not None else self._engine_for(loss)
        gradient = _runtime.require_runtime().gradient
        if not kwargs.pop("scale_wrt_gas", True) and gradient.window_size > 1:
            loss = loss * gradient.window_size
        record.engine.set_gradient_accumulation_boundary(gradient.sync_gradients)
        record.engine.backward(loss, scale_wrt_gas=False, **kwargs)
        record.needs_step = record.needs_step or gradient.sync_gradients

    def engine_wrapper(self, model: torch.nn.Module) -> DeepSpeedEngineWrapper:
        """Accelerate's `DeepSpeedEngineWrapper` around the engine of `model` (the engine or its module)."""
        return DeepSpeedEngineWrapper(self.record(model).engine)

    def _engine_for(self, loss: torch.Tensor) -> Engine:
        """The one trainable engine, or the one whose parameters this loss was computed from."""
        trainable = [e for e in self.engines if e.trainable]
        if len(trainable) == 1:
            return trainable[0]
        reached = _graph_parameters(loss)
        hit = [e for e in trainable if any(id(p) in reached for p in e.engine.module.parameters())]
        if len(hit) == 1:
            return hit[0]
        names = ", ".join(f"{type(e.engine.module).__name__} ({e.plugin_name})" for e in hit or trainable)
        raise ValueError(
            f"this loss reaches {len(hit)} trainable DeepSpeed engines ({names}); say which one it trains: "
            "accelerator.backward(loss, model=engine)"
        )

    def optimizer_step(self, optimizer: torch.optim.Optimizer, closure: Any = None) -> bool:
        record = self.record(optimizer)
        if closure is not None:
            raise ValueError("DeepSpeed engines do not take an optimizer closure")
        if record.needs_step:
            self._step(record, None)
        return bool(record.engine.was_step_applied())

    def zero_grad(self, optimizer: torch.optim.Optimizer, set_to_none: bool = True) -> None:
        """The engine clears gradients itself after each step."""
        if id(optimizer) not in self._by_id:
            super().zero_grad(optimizer, set_to_none)

    def clip_grad_norm_(
        self, parameters: Iterable[torch.nn.Parameter], max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor:
        """Steps the engine with `max_norm` as its clipping; returns the pre-clip norm of that step
        (mid-window, the last step's norm: ZeRO gradients are partitioned until the boundary)."""
        params = list(parameters)
        owners = {id(self._by_id[id(p)]): self._by_id[id(p)] for p in params if id(p) in self._by_id}
        if not owners:
            return super().clip_grad_norm_(params, max_norm, norm_type)
        if len(owners) > 1 or len(params) != sum(1 for p in params if id(p) in self._by_id):
            raise ValueError("clip_grad_norm_ under DeepSpeed takes the parameters of one prepared model")
        if float(norm_type) != 2.0:
            raise ValueError(f"DeepSpeed clips by the 2-norm; norm_type={norm_type} is not supported")
        (record,) = owners.values()
        if record.needs_step:
            self._step(record, 0.0 if math.isinf(max_norm) else float(max_norm))
        norm = record.last_norm if record.last_norm is not None else float("nan")
        return torch.as_tensor(norm, dtype=torch.float32, device=self.ctx.device).detach().clone()

    def clip_grad_value_(self, parameters: Iterable[torch.nn.Parameter], clip_value: float) -> None:
        if any(id(p) in self._by_id for p in parameters):
            raise ValueError(
                "DeepSpeed clips gradients by norm only (gradient_clipping); use accelerator.clip_grad_norm_"
            )
        super().clip_grad_value_(parameters, clip_value)

    def _step(self, record: Engine, clip: float | None) -> None:
        """One optimizer step of `record`'s engine, clipping at `clip` (None: the config's value)."""
        if clip is not None and record.clip > 0 and clip not in (0.0, record.clip):
            raise ValueError(
                f"clip_grad_norm_(max_norm={clip}) contradicts the DeepSpeed config's gradient_clipping="
                f'{record.clip}; pass the same value or make gradient_clipping "auto"'
            )
        value = record.clip if clip is None or clip == 0.0 and record.clip > 0 else clip
        engine, optimizer = record.engine, record.engine.optimizer
        record.needs_step = False
        if hasattr(optimizer, "clip_grad"):
            optimizer.clip_grad = value
            try:
                engine.step()
            finally:
                optimizer.clip_grad = record.clip
            norm = engine.get_global_grad_norm()
        else:  # a plain torch optimizer (ZeRO-0, fp32): gradients are whole and averaged by now
            norm = torch.nn.utils.clip_grad_norm_(
                engine.module.parameters(), value if value > 0 else math.inf
            )
            engine.step()
        record.last_norm = norm

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        record = self._by_id.get(id(model))
        return record.engine.module if record is not None else model  # type: ignore[no-any-return]

    # ---- state --------------------------------------------------------------------------------
    def state_io(self) -> StateIO:
        from accelerando.strategies.deepspeed_state_io import DeepSpeedStateIO

        return DeepSpeedStateIO(self)

    def model_state_dict(self, model: torch.nn.Module, *, full: bool = True) -> dict[str, Any]:
        """full: whole tensors on CPU on rank 0 ({} elsewhere), ZeRO-3 gathered one module at a time."""
        from accelerando.strategies import deepspeed_weights

        record = self._by_id.get(id(model))
        module = self.unwrap(model)
        if not full or record is None:
            return module.state_dict()
        return deepspeed_weights.full_state_dict(module, zero3=record.stage == 3, rank=self.ctx.rank)

    def load_model_state_dict(
        self, model: torch.nn.Module, state_dict: dict[str, Any], *, full: bool = True, strict: bool = True
    ) -> Any:
        """Rank 0's whole tensors into every rank's engine, master weights included (collective)."""
        from accelerando.strategies import deepspeed_weights

        record = self.record(model)
        deepspeed_weights.load_full_state_dict(record.engine, state_dict, strict=strict, rank=self.ctx.rank)

    def teardown(self) -> None:
        for record in self.engines:
            with contextlib.suppress(Exception):  # releasing hooks of an engine that failed midway
                record.engine.destroy()
        self.engines.clear()
        self._by_id.clear()
        self.engine_wrapped = None


def _pair(request: PrepareRequest) -> list[EngineRequest]:
    """Each model with the optimizer whose parameters it owns and that optimizer's scheduler."""
    owners: dict[int, int] = {}
    for index, model in enumerate(request.models):
        for param in model.parameters():
            owners.setdefault(id(param), index)
    optimizers: dict[int, Any] = {}
    for optimizer in request.optimizers:
        index = _owner(optimizer, owners)
        if index in optimizers:
            raise ValueError(
                "two optimizers update the same model; DeepSpeed builds one engine with one optimizer"
            )
        optimizers[index] = optimizer
    schedulers: dict[int, Any] = {}
    for scheduler in request.schedulers:
        target = getattr(scheduler, "optimizer", None)
        matches = [i for i, o in optimizers.items() if o is target]
        if not matches:
            raise ValueError(
                f"{type(scheduler).__name__}'s optimizer is not prepared in the same call; prepare the model, its "
                "optimizer and its scheduler together"
            )
        schedulers[matches[0]] = scheduler
    return [
        EngineRequest(model, optimizers.get(i), schedulers.get(i)) for i, model in enumerate(request.models)
    ]


def _owner(optimizer: Any, owners: dict[int, int]) -> int:
    groups = optimizer.param_groups if hasattr(optimizer, "param_groups") else optimizer.params
    params = [p for g in groups for p in (g["params"] if isinstance(g, dict) else [g])]
    found = {owners[id(p)] for p in params if id(p) in owners}
    if len(found) != 1:
        what = "no model" if not found else "several models"
        raise ValueError(
            f"a {type(optimizer).__name__} updates parameters of {what} of this prepare() call; DeepSpeed builds "
            "one engine per model with that model's optimizer: prepare them together"
        )
    return found.pop()


def _graph_parameters(loss: torch.Tensor) -> set[int]:
    """ids of the leaf tensors whose gradients `loss.backward()` would accumulate."""
    found: set[int] = set()
    seen: set[int] = set()
    stack = [loss.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        variable = getattr(fn, "variable", None)
        if variable is not None:
            found.add(id(variable))
        stack.extend(next_fn for next_fn, _ in fn.next_functions)
    return found


def _set_moe_leaf_modules(module: torch.nn.Module, class_names: str | None) -> None:
    """ZeRO-3 treats each MoE block as one unit (its experts run data-dependently)."""
    if not class_names:
        return
    from deepspeed.utils import set_z3_leaf_modules

    wanted = [n.strip() for n in class_names.split(",") if n.strip()]
    classes = {type(m) for m in module.modules() if type(m).__name__ in wanted}
    missing = sorted(set(wanted) - {c.__name__ for c in classes})
    if missing:
        raise ValueError(f"transformer_moe_cls_names: the model has no module of class {', '.join(missing)}")
    set_z3_leaf_modules(module, list(classes))


def _use_cpu_accelerator() -> None:
    """DeepSpeed picks CUDA when it sees it; a CPU run (`cpu=True`) must use its CPU accelerator."""
    from deepspeed.accelerator import get_accelerator, set_accelerator

    if get_accelerator().device_name() != "cpu":
        from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

        set_accelerator(CPU_Accelerator())


def _forget_destroyed_groups() -> None:
    """DeepSpeed keeps the groups it cloned from the world group; once that world is destroyed (an
    earlier Accelerator's runtime reset in this process), its engines would use dead groups."""
    from deepspeed.utils import groups

    world = getattr(groups, "_WORLD_GROUP", None)
    release = getattr(groups, "_release_process_group_references", None)
    if world is not None and release is not None and world not in dist.distributed_c10d._world.pg_map:
        release(None)


def _one_process_group(device: torch.device) -> None:
    """DeepSpeed needs a process group even for one process: a private one-rank group, gone at exit."""
    backend = dist.get_default_backend_for_device(device.type)
    dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)
    atexit.register(lambda: dist.destroy_process_group() if dist.is_initialized() else None)
