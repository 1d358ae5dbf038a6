"""Which strategy a resolved configuration asks for, and the strategy built for this process.

Pure functions of the configuration and the topology: the facade calls `resolve_strategy` and
never names a strategy; a new backend adds a registry line and, if it has a switch in the
configuration, one line in `strategy_name`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from accelerando.cluster.base import ProcessTopology
from accelerando.parallel.mesh import MeshShape, ParallelMesh
from accelerando.precision.base import Precision
from accelerando.strategies.base import Strategy, StrategyContext
from accelerando.strategies.registry import strategy_class

if TYPE_CHECKING:
    from accelerando.config.resolve import ResolvedConfig


def strategy_name(config: ResolvedConfig, world_size: int) -> str:
    """The registry name for `config`: an explicit backend first, else DDP across processes."""
    if config.use_deepspeed:
        return "deepspeed"
    if config.use_fsdp:
        return "fsdp2"
    return "ddp" if world_size > 1 else "single_device"


def plan_strategy(
    config: ResolvedConfig, topology: ProcessTopology
) -> tuple[type[Strategy], dict[str, Any], MeshShape]:
    """The strategy class, its options and its mesh shape; pure, so the facade can call it before
    any process group exists (bad ParallelismConfig sizes fail there, naming the numbers)."""
    cls = strategy_class(strategy_name(config, topology.world_size))
    options = cls.options(config)
    parallelism = config.parallelism
    if parallelism is None or (parallelism.total_size == 1 and not parallelism.sp_enabled):
        return cls, options, cls.mesh_shape(topology, **options)  # all sizes 1: the strategy's own layout
    return cls, options, cls.adopt_mesh_shape(parallelism.mesh_shape(topology.world_size), **options)


def resolve_strategy(
    config: ResolvedConfig,
    *,
    topology: ProcessTopology,
    device: torch.device,
    precision: Precision,
    backend: str | None,
) -> Strategy:
    """Build the strategy and the mesh it lays the ranks out on (validated here, built lazily); the
    facade drives `strategy.ctx.precision` (the strategy may replace the one it was given)."""
    cls, options, shape = plan_strategy(config, topology)
    precision.check_strategy(cls.name)
    mesh = ParallelMesh(shape, rank=topology.rank, device_type=device.type)
    precision = cls.adapt_precision(precision)
    handler = config.parallelism.tp_handler if config.parallelism is not None else None
    ctx = StrategyContext(
        device=device,
        topology=topology,
        precision=precision,
        backend=backend,
        mesh=mesh,
        tp_plan=getattr(handler, "tp_plan", None),
    )
    return cls(ctx, **options)


def running_deepspeed(runtime: Any) -> Strategy | None:
    """The DeepSpeed strategy an earlier Accelerator of this process runs, which a later one given
    no DeepSpeed plugin joins (Accelerate's shared state): its engines stay reachable from both, and
    `select_deepspeed_plugin` picks the plugin the next `prepare` builds with."""
    current = runtime.strategy if runtime.accelerator_ready else None
    return current if current is not None and current.name == "deepspeed" else None


def set_up_strategy(config: ResolvedConfig, runtime: Any) -> Strategy:
    """The precision and strategy this process trains with, its environment set up; a
    ParallelismConfig gets its device mesh now, as Accelerate builds it eagerly."""
    from accelerando.precision import build_precision

    handlers = config.handlers
    precision = build_precision(
        config.mixed_precision, runtime.device.type, handlers.autocast, handlers.scaler, config.fp8
    )
    strategy = resolve_strategy(
        config, topology=runtime.topology, device=runtime.device, precision=precision, backend=runtime.backend
    )
    strategy.setup_environment()
    if config.parallelism is not None and runtime.topology.is_distributed:
        config.parallelism.device_mesh = strategy.ctx.mesh.build()
    return strategy
