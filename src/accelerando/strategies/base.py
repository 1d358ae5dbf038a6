"""The Strategy interface: how models and optimizers are composed, distributed, synced, stepped and saved.

The facade never asks which strategy it has: it calls these methods. `prepare` receives every
model, optimizer and scheduler of one `Accelerator.prepare` call together (sharding and engine
strategies wrap them jointly) and runs the composition order of DESIGN.md principle 8 in
`prepare_model`; strategies change single steps of it, never the order.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from accelerando.cluster.base import ProcessTopology
from accelerando.config.options import DistributedType, TorchDynamoPlugin
from accelerando.parallel import grad_norm
from accelerando.parallel.activation_checkpointing import apply_activation_checkpointing
from accelerando.parallel.compile import compile_model
from accelerando.parallel.mesh import MeshShape, ParallelMesh
from accelerando.precision.base import Precision
from accelerando.strategies import compose, dtensor_state

if TYPE_CHECKING:
    from accelerando.checkpoint.state_io import StateIO
    from accelerando.config.resolve import ResolvedConfig


@dataclass(frozen=True)
class Capabilities:
    """What the facade must know before it calls: only flags that something reads.

    `owns_gradient_accumulation`: the strategy scales the loss for accumulation and decides when
    the optimizer really steps (an engine such as DeepSpeed); `Accelerator.backward` and
    `AcceleratedOptimizer` then leave both to it.
    """

    owns_gradient_accumulation: bool = False


@dataclass(frozen=True)
class StrategyContext:
    """What every strategy is built with: where it runs, how the ranks are laid out, the precision."""

    device: torch.device
    topology: ProcessTopology
    precision: Precision
    backend: str | None
    mesh: ParallelMesh
    tp_plan: dict[str, Any] | None = None  # the user's tensor-parallel plan (TorchTensorParallelConfig)

    @property
    def rank(self) -> int:
        return self.topology.rank

    @property
    def world_size(self) -> int:
        return self.topology.world_size


@dataclass
class PrepareRequest:
    """Everything one `Accelerator.prepare` call hands the strategy, in the caller's order."""

    models: list[torch.nn.Module] = field(default_factory=list)
    optimizers: list[torch.optim.Optimizer] = field(default_factory=list)
    schedulers: list[Any] = field(default_factory=list)
    batch_sizes: list[int | None] = field(default_factory=list)  # of the loaders prepared so far
    device_placement: list[bool] = field(default_factory=list)  # one per model; empty: place all
    dynamo: TorchDynamoPlugin = field(default_factory=TorchDynamoPlugin)
    evaluation_mode: bool = False

    def placement(self, index: int) -> bool:
        return self.device_placement[index] if self.device_placement else True


@dataclass
class Prepared:
    """What `prepare` hands back, in the request's order (engines may replace any of them)."""

    models: list[torch.nn.Module]
    optimizers: list[torch.optim.Optimizer]
    schedulers: list[Any]


class Strategy:
    """Single device, no wrapping. Subclasses override the steps they change."""

    name = "single_device"
    capabilities = Capabilities()

    def __init__(self, ctx: StrategyContext) -> None:
        self.ctx = ctx
        self._prepared_models: list[torch.nn.Module] = []

    # ---- resolution: what the resolver asks before building the strategy ---------------------
    @classmethod
    def options(cls, config: ResolvedConfig) -> dict[str, Any]:
        """Constructor arguments taken from the resolved configuration."""
        return {}

    @classmethod
    def mesh_shape(cls, topology: ProcessTopology, **options: Any) -> MeshShape:
        """How this strategy lays the ranks out: every rank a replica (data parallel)."""
        return MeshShape.resolve(topology.world_size, dp_replicate=-1, dp_shard=1)

    @classmethod
    def adopt_mesh_shape(cls, shape: MeshShape, **options: Any) -> MeshShape:
        """The layout of a ParallelismConfig, if this strategy can run it (else a ValueError naming the
        sizes). Replicas (DDP) cannot shard parameters nor split sequences: that needs FSDP."""
        if shape.dp_shard > 1 or shape.cp > 1:
            raise ValueError(
                f"ParallelismConfig dp_shard_size={shape.dp_shard}, cp_size={shape.cp}: sharding parameters "
                f"(and context parallelism) needs FSDP, but this job runs {cls.name!r}; pass "
                "fsdp_plugin=FullyShardedDataParallelPlugin() (or launch with --use_fsdp), or use dp_replicate_size"
            )
        if shape.dp_replicate > 1 and shape.tp > 1:
            raise ValueError(
                f"ParallelismConfig dp_replicate_size={shape.dp_replicate} with tp_size={shape.tp}: replicas of a "
                f"tensor-parallel model are not available under {cls.name!r} (DDP sees only local shards, so "
                "clipping and checkpoints would be wrong); use FSDP (fsdp_plugin) with dp_shard_size, which "
                "composes with tensor parallelism"
            )
        return shape

    @classmethod
    def adapt_precision(cls, precision: Precision) -> Precision:
        """The precision the facade drives (an engine that casts and scales itself swaps in a no-op one)."""
        return precision

    @property
    def distributed_type(self) -> DistributedType:
        return DistributedType.NO

    def setup_environment(self) -> None:
        """Runs once the process group exists and before any `prepare`."""

    # ---- prepare ------------------------------------------------------------------------------
    def prepare(self, request: PrepareRequest) -> Prepared:
        """Compose every model, then point the optimizers at the parameters that replaced theirs."""
        models, optimizers = self.ctx.precision.initialize(list(request.models), list(request.optimizers))
        compose.follow_replaced_optimizers(request.schedulers, request.optimizers, optimizers)
        names = compose.parameter_names(models)
        models = [
            self.prepare_model(
                model,
                place=request.placement(i),
                dynamo=request.dynamo,
                evaluation_mode=request.evaluation_mode,
            )
            for i, model in enumerate(models)
        ]
        self.rebind_optimizers(optimizers, names, models)
        if self._tensor_parallel:  # their optimizers' state dicts need them (`_owner`)
            self._prepared_models.extend(self.unwrap(m) for m in models)
        return Prepared(models, optimizers, list(request.schedulers))

    def prepare_model(
        self,
        model: torch.nn.Module,
        *,
        place: bool = True,
        dynamo: TorchDynamoPlugin | None = None,
        evaluation_mode: bool = False,
    ) -> torch.nn.Module:
        """The composition order (DESIGN.md principle 8) as code: precision conversion (fp8) ->
        device placement and autocast forward -> tensor / context parallel -> activation
        checkpointing -> compile -> wrap (DDP / FSDP2)."""
        self.check_model(model)
        precision = self.ctx.precision
        model = precision.convert_module(model)
        if place:
            model = compose.place_on_device(model, self.ctx.device)
        compose.wrap_forward_in_autocast(model, precision)
        model = self.parallelize(model)
        apply_activation_checkpointing(self.checkpointed_modules(model))
        if dynamo is not None:
            model = compile_model(model, dynamo)
        return self.wrap_model(model, evaluation_mode=evaluation_mode)

    def check_model(self, model: torch.nn.Module) -> None:
        """Refuse a model this strategy cannot train, before anything changes it."""

    def parallelize(self, model: torch.nn.Module) -> torch.nn.Module:
        """Tensor parallelism over the mesh's `tp` dimension (the user's plan or the model's own)."""
        if self.ctx.mesh.shape.tp == 1:
            return model
        from accelerando.parallel.tensor_parallel import apply_tensor_parallel

        return apply_tensor_parallel(model, self.ctx.mesh["tp"], self.ctx.tp_plan)

    def checkpointed_modules(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        """The blocks whose activations are recomputed in backward (none unless configured)."""
        return []

    def wrap_model(self, model: torch.nn.Module, *, evaluation_mode: bool = False) -> torch.nn.Module:
        return model

    def rebind_optimizers(
        self,
        optimizers: list[torch.optim.Optimizer],
        names: compose.ParameterNames,
        models: list[torch.nn.Module],
    ) -> None:
        """Strategies that replace parameters (sharding) point the optimizers at the new ones; so do
        tensor parallelism (DTensor shards) and a precision whose conversion does (Transformer Engine)."""
        if self.ctx.mesh.shape.tp > 1 or self.ctx.precision.replaces_parameters:
            unwrapped = [self.unwrap(m) for m in models]
            for optimizer in optimizers:
                compose.rebind_optimizer(optimizer, names, unwrapped)

    # ---- training step ------------------------------------------------------------------------
    @contextlib.contextmanager
    def no_sync(self, model: torch.nn.Module) -> Iterator[None]:
        yield

    @contextlib.contextmanager
    def sync_in_backward(self, model: torch.nn.Module) -> Iterator[None]:
        """Make the next backward synchronise gradients even after forwards under `no_sync`."""
        yield

    def join_context(self, joinables: list[Any]) -> contextlib.AbstractContextManager:
        """Let ranks run different numbers of steps: only data-parallel replicas (DDP) can join;
        other distributed strategies say so, with Accelerate's warning, and run unjoined."""
        if self.distributed_type != DistributedType.NO:
            warnings.warn(
                "Joining uneven inputs is only supported for multi-GPU training, as a result "
                f"`join_uneven_inputs` will have no effect (strategy {self.name!r} does not join)",
                stacklevel=3,
            )
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor, model: torch.nn.Module | None = None, **kwargs: Any) -> None:
        self.ctx.precision.scale(loss).backward(**kwargs)

    def optimizer_step(self, optimizer: torch.optim.Optimizer, closure: Any = None) -> bool:
        return self.ctx.precision.step(optimizer, closure)

    def zero_grad(self, optimizer: torch.optim.Optimizer, set_to_none: bool = True) -> None:
        optimizer.zero_grad(set_to_none=set_to_none)

    def clip_grad_norm_(
        self, parameters: Iterable[torch.nn.Parameter], max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor:
        """torch's clipping; over DTensor gradients (tensor parallel) the norm of the whole gradient."""
        params = list(parameters)
        if grad_norm.has_dtensor_grads(params):
            return grad_norm.clip_grad_norm_(params, max_norm, norm_type)
        return torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type=norm_type)

    def clip_grad_value_(self, parameters: Iterable[torch.nn.Parameter], clip_value: float) -> None:
        grad_norm.clip_grad_value_(parameters, clip_value)

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return model

    # ---- state: what the checkpointer calls, never inspecting the strategy --------------------
    def state_io(self) -> StateIO:
        """The on-disk format of what this strategy owns (models and optimizers): tensor-parallel
        shards go through DCP, which reshards on load (to one unsharded process, say)."""
        from accelerando.strategies.state_io import DCPStateIO, FullStateIO

        return DCPStateIO(self) if self._tensor_parallel else FullStateIO(self)

    @property
    def _tensor_parallel(self) -> bool:
        return self.ctx.mesh.shape.tp > 1

    def model_state_dict(self, model: torch.nn.Module, *, full: bool = True) -> dict[str, Any]:
        """Model weights. `full=True`: unsharded tensors on CPU, complete at least on rank 0
        (sharding strategies may return `{}` elsewhere); `full=False`: this rank's shards (DTensors)."""
        if self._tensor_parallel:
            return dtensor_state.model_state_dict(self.unwrap(model), full)
        return self.unwrap(model).state_dict()

    def load_model_state_dict(
        self, model: torch.nn.Module, state_dict: dict[str, Any], *, full: bool = True, strict: bool = True
    ) -> Any:
        """Inverse of `model_state_dict`; with `full=True` a sharding strategy reads rank 0's copy."""
        if self._tensor_parallel:
            return dtensor_state.load_model_state_dict(self.unwrap(model), state_dict, full, strict)
        return self.unwrap(model).load_state_dict(state_dict, strict=strict)

    def optimizer_state_dict(
        self, model: torch.nn.Module | None, optimizer: torch.optim.Optimizer, *, full: bool = True
    ) -> dict[str, Any]:
        if self._tensor_parallel:
            raw = compose.raw_optimizer(optimizer)
            return dtensor_state.optimizer_state_dict(self._owner(model, raw), raw, full)
        return optimizer.state_dict()

    def load_optimizer_state_dict(
        self,
        model: torch.nn.Module | None,
        optimizer: torch.optim.Optimizer,
        state_dict: dict[str, Any],
        *,
        full: bool = True,
    ) -> None:
        if self._tensor_parallel:
            raw = compose.raw_optimizer(optimizer)
            dtensor_state.load_optimizer_state_dict(self._owner(model, raw), raw, state_dict, full)
            return
        optimizer.load_state_dict(state_dict)

    def _owner(self, model: torch.nn.Module | None, optimizer: torch.optim.Optimizer) -> torch.nn.Module:
        """The prepared model whose parameters `optimizer` updates (checkpoint hooks may pass None)."""
        if model is not None:
            return self.unwrap(model)
        wanted = {id(p) for group in optimizer.param_groups for p in group["params"]}
        for candidate in self._prepared_models:
            if any(id(p) in wanted for p in candidate.parameters()):
                return candidate
        raise ValueError("this optimizer's parameters belong to no prepared model; prepare them together")

    # ---- topology -----------------------------------------------------------------------------
    @property
    def data_parallel_rank(self) -> int:
        return self.ctx.mesh.data_parallel_rank

    @property
    def data_parallel_size(self) -> int:
        return self.ctx.mesh.data_parallel_size

    def teardown(self) -> None:
        """Release what `prepare` created (engines, hooks)."""
        self._prepared_models.clear()
