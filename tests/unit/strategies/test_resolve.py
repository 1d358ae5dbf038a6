"""Strategy resolution for every configuration combination: pure, no process group."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch

from accelerando.cluster.base import ProcessTopology
from accelerando.config import env
from accelerando.config.fsdp import FullyShardedDataParallelPlugin
from accelerando.config.options import DistributedDataParallelKwargs, DistributedType
from accelerando.config.resolve import ResolvedConfig, resolve
from accelerando.parallel.mesh import MeshShape
from accelerando.precision.base import Precision
from accelerando.strategies import STRATEGIES, resolve_strategy, strategy_name
from accelerando.strategies.ddp import DDPStrategy
from accelerando.strategies.fsdp2 import FSDP2Strategy
from accelerando.strategies.single_device import SingleDeviceStrategy


def config(
    environ: dict[str, str] | None = None, fsdp_plugin: Any = None, handlers: list[Any] | None = None
) -> ResolvedConfig:
    return resolve(
        cpu=True,
        mixed_precision=None,
        gradient_accumulation_steps=1,
        gradient_accumulation_plugin=None,
        dataloader_config=None,
        project_dir=None,
        project_config=None,
        kwargs_handlers=handlers,
        dynamo_backend=None,
        dynamo_plugin=None,
        device_placement=True,
        step_scheduler_with_optimizer=True,
        rng_types=None,
        fsdp_plugin=fsdp_plugin,
        settings=env.read_settings(environ or {}),
    )


def topology(world: int, rank: int = 0, local: int | None = None) -> ProcessTopology:
    local = world if local is None else local
    return ProcessTopology(rank=rank, local_rank=rank % local, world_size=world, local_world_size=local)


def build(cfg: ResolvedConfig, topo: ProcessTopology, device: str = "cpu") -> Any:
    return resolve_strategy(
        cfg, topology=topo, device=torch.device(device), precision=Precision(), backend=None
    )


FSDP_ENV = {"ACCELERANDO_USE_FSDP": "true"}
DS_ENV = {"ACCELERATE_USE_DEEPSPEED": "true"}


@pytest.mark.parametrize("world", [1, 2, 3, 8, 16])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("fsdp", ["none", "plugin", "environment"])
def test_every_combination_picks_one_strategy_and_its_mesh(world: int, device: str, fsdp: str) -> None:
    plugin = FullyShardedDataParallelPlugin() if fsdp == "plugin" else None
    cfg = config(FSDP_ENV if fsdp == "environment" else None, fsdp_plugin=plugin)
    rank = world - 1
    strategy = build(cfg, topology(world, rank), device)
    if fsdp != "none":
        assert type(strategy) is FSDP2Strategy and strategy_name(cfg, world) == "fsdp2"
        assert strategy.ctx.mesh.shape == MeshShape(dp_shard=world)
        assert strategy.distributed_type == DistributedType.FSDP
        if plugin is not None:
            assert strategy.plugin is plugin
    elif world > 1:
        assert type(strategy) is DDPStrategy and strategy_name(cfg, world) == "ddp"
        assert strategy.ctx.mesh.shape == MeshShape(dp_replicate=world)
        want = DistributedType.MULTI_CPU if device == "cpu" else DistributedType.MULTI_GPU
        assert strategy.distributed_type == want
    else:
        assert type(strategy) is SingleDeviceStrategy and strategy_name(cfg, world) == "single_device"
        assert strategy.ctx.mesh.shape == MeshShape()
        assert strategy.distributed_type == DistributedType.NO
    # Data parallelism over every rank: the mesh answers what the topology would.
    assert (strategy.data_parallel_rank, strategy.data_parallel_size) == (rank, world)
    assert strategy.ctx.rank == rank and strategy.ctx.world_size == world
    assert strategy.ctx.device == torch.device(device)
    assert strategy.ctx.mesh._root is None  # validated, not built: no process group was touched


@pytest.mark.parametrize("world", [1, 2, 8])
def test_deepspeed_from_the_launcher_builds_the_deepspeed_strategy(world: int) -> None:
    """The launcher's request gives a DeepSpeed strategy (never DDP), sharding over every rank, whose
    engines own precision; asking for FSDP as well is refused naming both."""
    from accelerando.strategies.deepspeed import DeepSpeedStrategy, EnginePrecision

    cfg = config({**DS_ENV, "ACCELERANDO_DEEPSPEED_ZERO_STAGE": "3"})
    assert strategy_name(cfg, world) == "deepspeed" and cfg.use_deepspeed
    strategy = build(cfg, topology(world, world - 1))
    assert type(strategy) is DeepSpeedStrategy and strategy.distributed_type == DistributedType.DEEPSPEED
    assert strategy.ctx.mesh.shape == MeshShape(dp_shard=world)
    assert isinstance(strategy.ctx.precision, EnginePrecision) and not strategy.ctx.precision.wraps_forward
    assert strategy.plugin.zero_stage == 3 and list(strategy.plugins) == ["default"]
    with pytest.raises(ValueError, match="DeepSpeed and FSDP were both asked for"):
        config({**DS_ENV, **FSDP_ENV})


def test_ddp_kwargs_reach_the_ddp_strategy() -> None:
    handler = DistributedDataParallelKwargs(find_unused_parameters=True)
    strategy = build(config(handlers=[handler]), topology(2))
    assert isinstance(strategy, DDPStrategy) and strategy.ddp_kwargs is handler


@pytest.mark.parametrize(
    ("world", "local", "shape"),
    [(2, 2, MeshShape(1, 2)), (8, 4, MeshShape(2, 4)), (16, 2, MeshShape(8, 2)), (4, 1, MeshShape(4, 1))],
)
def test_hybrid_shard_replicates_across_nodes_and_shards_within(
    world: int, local: int, shape: MeshShape
) -> None:
    plugin = FullyShardedDataParallelPlugin(sharding_strategy="HYBRID_SHARD")
    for rank in range(world):
        strategy = build(config(fsdp_plugin=plugin), topology(world, rank, local))
        assert strategy.ctx.mesh.shape == shape
        assert strategy.data_parallel_rank == rank and strategy.data_parallel_size == world


def test_hybrid_shard_refuses_uneven_nodes_naming_the_numbers() -> None:
    plugin = FullyShardedDataParallelPlugin(sharding_strategy="HYBRID_SHARD")
    with pytest.raises(ValueError, match="HYBRID_SHARD needs world size 6 divisible by 4"):
        build(config(fsdp_plugin=plugin), topology(6, 0, 4))


def test_a_wrong_plugin_type_is_refused() -> None:
    with pytest.raises(TypeError, match="FullyShardedDataParallelPlugin, got dict"):
        build(config(fsdp_plugin={"sharding_strategy": "FULL_SHARD"}), topology(2))


def test_registry_refuses_unknown_names() -> None:
    from accelerando.strategies.registry import strategy_class

    with pytest.raises(ValueError, match=r"unknown strategy 'megatron'; accepted: single_device, ddp"):
        strategy_class("megatron")
    assert set(STRATEGIES) >= {"single_device", "ddp", "fsdp2", "deepspeed"}


def test_the_facade_names_no_strategy() -> None:
    """accelerator.py delegates the choice: no registry name, strategy class or DDP internals in it."""
    import accelerando.accelerator as facade

    source = Path(facade.__file__).read_text()
    for name in STRATEGIES:
        assert not re.search(rf"[\"']{name}[\"']", source), name
    for needle in (
        "DDPStrategy",
        "FSDP2Strategy",
        "DistributedDataParallel",
        "reducer",
        "capabilities.shards",
    ):
        assert needle not in source, needle
    assert len(source.splitlines()) < 700
