"""Fully sharded data parallel through FSDP2 (`torch.distributed.fsdp.fully_shard`, DTensor).

Each rank keeps 1/world of every parameter, gradient and optimizer state. `prepare` receives all
models and optimizers at once because sharding replaces the parameters: optimizers created before
`prepare` (as in every Accelerate example) are re-bound to the sharded parameters by name.
Within `Strategy.prepare_model`'s order this strategy supplies activation checkpointing of the
planned units (before compile) and the wrap: units -> root -> loading rank 0's weights.
The shards live on the mesh's `dp_shard` dimension (`dp_replicate` x `dp_shard` for HYBRID_SHARD).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from accelerando.cluster.base import ProcessTopology
from accelerando.config.fsdp import (
    SHARDED_STATE_DICT,
    FullyShardedDataParallelPlugin,
    enable_fsdp_ram_efficient_loading,
    warn_once,
)
from accelerando.config.options import DistributedType
from accelerando.parallel import grad_norm
from accelerando.parallel.mesh import MeshShape
from accelerando.strategies import dtensor_state, fsdp_loading
from accelerando.strategies.base import Strategy, StrategyContext
from accelerando.strategies.compose import ParameterNames, inner_module, raw_optimizer, rebind_optimizer
from accelerando.strategies.fsdp_wrap import WrapPlan, outermost, plan_wrapping

if TYPE_CHECKING:
    from accelerando.checkpoint.state_io import StateIO
    from accelerando.config.resolve import ResolvedConfig

_inner = inner_module


def _is_fsdp(module: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


class FSDP2Strategy(Strategy):
    name = "fsdp2"

    def __init__(self, ctx: StrategyContext, plugin: FullyShardedDataParallelPlugin | None = None) -> None:
        super().__init__(ctx)
        self.plugin = _check_plugin(plugin)
        self._models: list[torch.nn.Module] = []
        self.plans: list[WrapPlan] = []
        self._planned: dict[int, WrapPlan] = {}
        self._checked: set[int] = set()

    @classmethod
    def options(cls, config: ResolvedConfig) -> dict[str, Any]:
        return {"plugin": _check_plugin(config.fsdp_plugin)}

    @classmethod
    def mesh_shape(cls, topology: ProcessTopology, **options: Any) -> MeshShape:
        """Shard over every rank; HYBRID_SHARD: replicate across nodes, shard within a node."""
        plugin: FullyShardedDataParallelPlugin = options["plugin"]
        world = topology.world_size
        if not plugin.hybrid_shard:
            return MeshShape.resolve(world, dp_shard=-1)
        local = topology.local_world_size or world
        if world % local:
            raise ValueError(f"HYBRID_SHARD needs world size {world} divisible by {local} ranks per node")
        return MeshShape.resolve(world, dp_replicate=-1, dp_shard=local)

    @classmethod
    def adopt_mesh_shape(cls, shape: MeshShape, **options: Any) -> MeshShape:
        if shape.dp_shard * shape.cp == 1:
            raise ValueError(
                f"FSDP needs a dimension to shard over, but the ParallelismConfig has dp_shard_size="
                f"{shape.dp_shard} and cp_size={shape.cp}; raise dp_shard_size (or cp_size), or train without FSDP"
            )
        return shape

    @property
    def distributed_type(self) -> DistributedType:
        return DistributedType.FSDP

    @property
    def sharding(self) -> bool:
        """Without a process group (a single plain process) there is nothing to shard over."""
        return dist.is_available() and dist.is_initialized()

    def setup_environment(self) -> None:
        if not self.sharding:
            warn_once("FSDP without a process group (one process): the model is trained unsharded")
        if self.plugin.cpu_ram_efficient_loading:
            # The one message to another library: transformers' from_pretrained reads these variables
            # and then builds the model on meta on ranks other than 0.
            enable_fsdp_ram_efficient_loading()

    # ---- prepare: the steps of Strategy.prepare_model this strategy supplies ------------------
    def mesh(self) -> Any:
        """The `DeviceMesh` FSDP2 shards over, taken from the job's mesh: `dp_shard` (flattened with
        `cp` when context parallel), behind `dp_replicate` for HSDP (HYBRID_SHARD or dp_replicate > 1)."""
        shape = self.ctx.mesh.shape
        shard = "dp_shard_cp" if shape.cp > 1 else "dp_shard"
        if self.plugin.hybrid_shard or shape.dp_replicate > 1:
            return self.ctx.mesh[("dp_replicate", shard)]
        return self.ctx.mesh[shard]

    def _plan(self, target: torch.nn.Module) -> WrapPlan:
        """The units of `target`, planned once (before activation checkpointing and compile)."""
        if id(target) not in self._planned:
            self._planned[id(target)] = plan_wrapping(target, self.plugin)
        return self._planned[id(target)]

    def checkpointed_modules(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        target = _inner(model)
        if not self.plugin.activation_checkpointing or _is_fsdp(target) or not self.sharding:
            return []
        return self._plan(target).modules or [target]

    def rebind_optimizers(
        self, optimizers: list[torch.optim.Optimizer], names: ParameterNames, models: list[torch.nn.Module]
    ) -> None:
        for optimizer in optimizers:
            rebind_optimizer(optimizer, names, models)

    def wrap_model(self, model: torch.nn.Module, *, evaluation_mode: bool = False) -> torch.nn.Module:
        target = _inner(model)
        if _is_fsdp(target) or not self.sharding:
            self._models.append(model)
            return model
        from torch.distributed.fsdp import MixedPrecisionPolicy, OffloadPolicy, fully_shard

        plugin = self.plugin
        plan = self._plan(target)
        del self._planned[id(target)]
        self.plans.append(plan)
        if plugin.verbose and dist.get_rank() == 0:
            print(
                f"[accelerando fsdp] {type(target).__name__}: {len(plan.modules)} units + root ({plan.reason})"
            )
        ignored = plugin.ignored_parameters(target)
        for param in target.parameters():
            if param not in ignored:
                param._accelerando_replaced = True  # type: ignore[attr-defined]
        kept = self._before_sharding(target)
        mp = (
            plugin.mixed_precision_policy
            or self.ctx.precision.fsdp_mixed_precision()
            or MixedPrecisionPolicy()
        )
        kwargs: dict[str, Any] = {
            "mesh": self.mesh(),
            "reshard_after_forward": plugin.reshard_after_forward,
            "mp_policy": mp,
            "offload_policy": plugin.cpu_offload or OffloadPolicy(),
        }
        if ignored:
            kwargs["ignored_params"] = ignored
        for module in plan.modules:
            fully_shard(module, **kwargs)
        fully_shard(target, **kwargs)
        chain = outermost(plan.modules)
        if plugin.forward_prefetch and len(chain) > 1:
            for current, following in zip(chain, chain[1:]):
                current.set_modules_to_forward_prefetch([following])  # type: ignore[operator]
        if kept is not None:
            fsdp_loading.materialize_from_rank0(target, kept, self.ctx.device)
        self._models.append(model)
        return model

    def _before_sharding(self, model: torch.nn.Module) -> fsdp_loading.Rank0Weights | None:
        """Rank 0's weights reach every rank either after sharding (RAM-efficient) or before (sync)."""
        if self.plugin.cpu_ram_efficient_loading:
            return fsdp_loading.move_to_meta(model, dist.get_rank())
        if fsdp_loading.has_meta_tensors(model):
            raise ValueError(
                "the model has parameters on the meta device; set cpu_ram_efficient_loading=True "
                "(FSDP_CPU_RAM_EFFICIENT_LOADING=1) so rank 0's weights are loaded into every rank's shards"
            )
        if self.plugin.sync_module_states:
            fsdp_loading.broadcast_module_states(model)
        return None

    # ---- training step ----------------------------------------------------------------------
    def optimizer_step(self, optimizer: torch.optim.Optimizer, closure: Any = None) -> bool:
        if id(optimizer) not in self._checked:
            stale = [
                p
                for g in optimizer.param_groups
                for p in g["params"]
                if getattr(p, "_accelerando_replaced", 0)
            ]
            if stale:
                raise ValueError(
                    f"this optimizer holds {len(stale)} parameters that FSDP replaced with shards; pass the "
                    "optimizer to the same accelerator.prepare(model, optimizer) call, or create it after prepare"
                )
            self._checked.add(id(optimizer))
        # fp16: DTensor's dispatch of the GradScaler's inf check already all-reduces found_inf, so
        # every rank skips the same steps (checked in tests/distributed/scripts/fsdp_train.py).
        return super().optimizer_step(optimizer, closure)

    @contextlib.contextmanager
    def no_sync(self, model: torch.nn.Module) -> Iterator[None]:
        """Gradients accumulate unsharded on this rank; the next synced backward reduce-scatters them."""
        target = _inner(model)
        if not _is_fsdp(target):
            yield
            return
        target.set_requires_gradient_sync(False)  # type: ignore[operator]
        try:
            yield
        finally:
            target.set_requires_gradient_sync(True)  # type: ignore[operator]

    def clip_grad_norm_(
        self, parameters: Iterable[torch.nn.Parameter], max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor:
        """The norm over the whole (unsharded) gradient, computed from the shards; returns a plain tensor."""
        return grad_norm.clip_grad_norm_(parameters, max_norm, norm_type)

    def clip_grad_value_(self, parameters: Iterable[torch.nn.Parameter], clip_value: float) -> None:
        grad_norm.clip_grad_value_(parameters, clip_value)

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return model  # FSDP2 shards in place: the user's module is the prepared one

    # ---- checkpoint hooks -------------------------------------------------------------------
    def state_io(self) -> StateIO:
        """SHARDED_STATE_DICT: every rank writes its shards through DCP; else full state dicts."""
        from accelerando.strategies.state_io import DCPStateIO, FullStateIO

        return DCPStateIO(self) if self.plugin.state_dict_type == SHARDED_STATE_DICT else FullStateIO(self)

    def model_state_dict(self, model: torch.nn.Module, *, full: bool = True) -> dict[str, Any]:
        """full: gathered tensor by tensor onto rank 0's CPU (others get {}); else this rank's DTensors."""
        return dtensor_state.model_state_dict(_inner(model), full, self.sharding)

    def load_model_state_dict(
        self, model: torch.nn.Module, state_dict: dict[str, Any], *, full: bool = True, strict: bool = True
    ) -> Any:
        return dtensor_state.load_model_state_dict(_inner(model), state_dict, full, strict, self.sharding)

    def optimizer_state_dict(
        self, model: torch.nn.Module | None, optimizer: torch.optim.Optimizer, *, full: bool = True
    ) -> dict[str, Any]:
        optimizer = raw_optimizer(optimizer)
        return dtensor_state.optimizer_state_dict(
            self._owner(model, optimizer), optimizer, full, self.sharding
        )

    def load_optimizer_state_dict(
        self,
        model: torch.nn.Module | None,
        optimizer: torch.optim.Optimizer,
        state_dict: dict[str, Any],
        *,
        full: bool = True,
    ) -> None:
        optimizer = raw_optimizer(optimizer)
        owner = self._owner(model, optimizer)
        dtensor_state.load_optimizer_state_dict(owner, optimizer, state_dict, full, self.sharding)

    def _owner(self, model: torch.nn.Module | None, optimizer: torch.optim.Optimizer) -> torch.nn.Module:
        """The prepared model whose parameters this optimizer updates (the hooks may pass None)."""
        if model is not None:
            return _inner(model)
        wanted = {id(p) for group in optimizer.param_groups for p in group["params"]}
        for candidate in self._models:
            if any(id(p) in wanted for p in candidate.parameters()):
                return _inner(candidate)
        raise ValueError(
            "this optimizer's parameters belong to no model prepared with FSDP; prepare them together"
        )

    def teardown(self) -> None:
        self._models.clear()
        self.plans.clear()


def _check_plugin(plugin: Any) -> FullyShardedDataParallelPlugin:
    if plugin is not None and not isinstance(plugin, FullyShardedDataParallelPlugin):
        raise TypeError(f"fsdp_plugin must be a FullyShardedDataParallelPlugin, got {type(plugin).__name__}")
    return plugin if plugin is not None else FullyShardedDataParallelPlugin()
