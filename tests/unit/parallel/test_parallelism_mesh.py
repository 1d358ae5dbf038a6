"""ParallelismConfig -> the job's mesh, for every combination of sizes up to 16 ranks (pure: no process).

Each configuration is resolved with each strategy the way `Accelerator()` does before any process
group exists; what a strategy cannot run is refused naming the sizes, and what it can run becomes the
mesh its components ask for their sub-meshes.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any

import pytest
import torch
import torch.distributed as dist

from accelerando import Accelerator
from accelerando.cluster.base import ProcessTopology
from accelerando.config import env
from accelerando.config.fsdp import FullyShardedDataParallelPlugin
from accelerando.config.resolve import ResolvedConfig, resolve
from accelerando.parallel.mesh import MeshShape, ParallelMesh
from accelerando.parallelism_config import ParallelismConfig
from accelerando.strategies.resolve import plan_strategy


def _config(parallelism: Any, environ: dict[str, str] | None = None, fsdp: bool = False) -> ResolvedConfig:
    return resolve(
        cpu=True,
        mixed_precision=None,
        gradient_accumulation_steps=1,
        gradient_accumulation_plugin=None,
        dataloader_config=None,
        project_dir=None,
        project_config=None,
        kwargs_handlers=None,
        dynamo_backend=None,
        dynamo_plugin=None,
        device_placement=True,
        step_scheduler_with_optimizer=True,
        rng_types=None,
        fsdp_plugin=FullyShardedDataParallelPlugin() if fsdp else None,
        settings=env.read_settings(environ or {}),
        parallelism_config=parallelism,
    )


def _topology(world: int) -> ProcessTopology:
    return ProcessTopology(rank=world - 1, local_rank=world - 1, world_size=world, local_world_size=world)


def _sizes(total: int) -> list[tuple[int, int, int, int]]:
    divisors = [d for d in range(1, total + 1) if total % d == 0]
    return [s for s in itertools.product(divisors, repeat=4) if math.prod(s) == total]


def _parallelism(sizes: tuple[int, int, int, int]) -> ParallelismConfig | None:
    """The config for (dp_replicate, dp_shard, cp, tp), or None where Accelerate's rules refuse it."""
    r, s, c, t = sizes
    try:
        return ParallelismConfig(dp_replicate_size=r, dp_shard_size=s, cp_size=c, tp_size=t)
    except ValueError as err:  # cp with pure replication: Accelerate's own refusal
        assert c > 1 and r > 1 and s == 1, (sizes, err)
        return None


CASES = [(w, sizes) for w in range(1, 17) for sizes in _sizes(w)]


@pytest.mark.parametrize("fsdp", [False, True], ids=["ddp", "fsdp"])
def test_every_combination_up_to_16_ranks(fsdp: bool) -> None:
    checked = 0
    for world, sizes in CASES:
        parallelism = _parallelism(sizes)
        if parallelism is None:
            continue
        r, s, c, t = sizes
        cfg = _config(parallelism, fsdp=fsdp)
        if world == 1:
            continue  # all sizes 1: the strategy's own layout (checked below)
        can_run = (s * c > 1) if fsdp else (s == 1 and c == 1)
        if not can_run:
            with pytest.raises(ValueError, match=rf"dp_shard_size={s}.* cp_size={c}"):
                plan_strategy(cfg, _topology(world))
            continue
        if not fsdp and r > 1 and t > 1:  # DDP would see local shards only
            with pytest.raises(ValueError, match=rf"dp_replicate_size={r} with tp_size={t}: .* use FSDP"):
                plan_strategy(cfg, _topology(world))
            continue
        _, _, shape = plan_strategy(cfg, _topology(world))
        assert shape == MeshShape(r, s, c, t)
        mesh = ParallelMesh(shape, world - 1, "cpu")
        assert (mesh.data_parallel_size, mesh.data_parallel_rank) == (r * s, r * s - 1)
        # the same sizes on any other world size are refused, naming both numbers
        other = world + 1
        with pytest.raises(ValueError, match=rf"= {world}, but the job has {other} processes"):
            plan_strategy(cfg, _topology(other))
        checked += 1
    assert checked == (
        128 if fsdp else 30
    )  # of 203 combinations on 2..16 ranks (26 refused by Accelerate's rules)


def test_all_sizes_one_keeps_the_strategys_layout() -> None:
    for fsdp, expected in ((False, MeshShape(dp_replicate=4)), (True, MeshShape(dp_shard=4))):
        _, _, shape = plan_strategy(_config(ParallelismConfig(), fsdp=fsdp), _topology(4))
        assert shape == expected


def test_deepspeed_refuses_tensor_and_context_parallelism() -> None:
    cfg = _config(ParallelismConfig(tp_size=2), environ={"ACCELERANDO_USE_DEEPSPEED": "true"})
    with pytest.raises(ValueError, match="tp_size=2, cp_size=1: tensor and context parallelism"):
        plan_strategy(cfg, _topology(2))
    cfg = _config(ParallelismConfig(dp_replicate_size=2), environ={"ACCELERANDO_USE_DEEPSPEED": "true"})
    assert plan_strategy(cfg, _topology(2))[2] == MeshShape(dp_shard=2)  # ZeRO partitions over all


def test_sequence_parallelism_is_refused_naming_what_is_accepted() -> None:
    with pytest.raises(
        ValueError, match=r"sp_size=2\): sequence parallelism .*DeepSpeed ALST/Ulysses.* accepted: sp_size=1"
    ):
        plan_strategy(_config(ParallelismConfig(sp_size=2)), _topology(2))
    with pytest.raises(
        ValueError, match=r"sp_size=2\): .*use context parallelism \(cp_size > 1, with FSDP\)"
    ):
        Accelerator(cpu=True, parallelism_config=ParallelismConfig(sp_size=2))  # before any process group
    assert not dist.is_initialized()
    acc = Accelerator(cpu=True)
    loader = torch.utils.data.DataLoader(list(range(4)))
    assert acc.deepspeed_ulysses_dl_adapter(loader, torch.nn.Linear(1, 1)) is loader  # Accelerate's hook


def test_the_launchers_variables_build_the_config() -> None:
    environ = {"ACCELERANDO_USE_PARALLELISM_CONFIG": "true"}
    assert _config(None, environ).parallelism == ParallelismConfig()
    assert _config(None).parallelism is None
    with pytest.raises(TypeError, match="must be a ParallelismConfig, got dict"):
        _config({"tp_size": 2})


def test_the_accelerator_refuses_before_any_process_group(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match=r"tp_size=2 = 4, but the job has 1 process;"):
        Accelerator(cpu=True, parallelism_config=ParallelismConfig(dp_replicate_size=2, tp_size=2))
    monkeypatch.setenv("ACCELERANDO_USE_PARALLELISM_CONFIG", "true")
    monkeypatch.setenv("PARALLELISM_CONFIG_TP_SIZE", "2")
    with pytest.raises(ValueError, match=r"tp_size=2 = 2, but the job has 1 process;"):
        Accelerator(cpu=True)
    assert not dist.is_initialized()


def test_one_process_with_all_sizes_one() -> None:
    acc = Accelerator(cpu=True, parallelism_config=ParallelismConfig())
    assert acc.parallelism_config == ParallelismConfig() and acc.torch_device_mesh is None
    assert (acc.data_parallel_size, acc.data_parallel_rank) == (1, 0)
    assert dataclasses.is_dataclass(acc.parallelism_config)
    assert (acc.tensor_parallel_rank, acc.context_parallel_rank, acc.data_parallel_shard_rank) == (0, 0, 0)
    assert acc.should_save_model and not acc.is_composable_parallelism_enabled
    with pytest.raises(NotImplementedError, match="Pipeline parallelism"):
        _ = acc.pipeline_parallel_rank


def test_mesh_ranks_need_a_parallelism_config() -> None:
    acc = Accelerator(cpu=True)
    with pytest.raises(RuntimeError, match="tp parallelism is not configured"):
        _ = acc.tensor_parallel_rank


def test_the_deprecated_tp_plugin_becomes_a_parallelism_config() -> None:
    """Accelerate 1.x maps `torch_tp_plugin` onto `ParallelismConfig(tp_size=...)`, with a FutureWarning."""
    from accelerando.utils import TorchTensorParallelPlugin

    with pytest.warns(FutureWarning, match=r"ParallelismConfig\(tp_size=2\)"):
        with pytest.raises(ValueError, match=r"tp_size=2 = 2, but the job has 1 process;"):
            Accelerator(cpu=True, torch_tp_plugin=TorchTensorParallelPlugin(tp_size=2))
    assert not dist.is_initialized()
    with pytest.warns(FutureWarning, match="TorchTensorParallelPlugin is deprecated"):
        acc = Accelerator(cpu=True, torch_tp_plugin=TorchTensorParallelPlugin())
    assert acc.parallelism_config == ParallelismConfig(tp_size=1)
    given = ParallelismConfig()
    with pytest.warns(FutureWarning):
        assert Accelerator(cpu=True, torch_tp_plugin=TorchTensorParallelPlugin(), parallelism_config=given)
    with (
        pytest.warns(FutureWarning),
        pytest.raises(ValueError, match="tp_size=2 contradicts parallelism_config.tp_size=1"),
    ):
        Accelerator(cpu=True, torch_tp_plugin=TorchTensorParallelPlugin(tp_size=2), parallelism_config=given)
    with pytest.raises(TypeError, match="torch_tp_plugin must be a TorchTensorParallelPlugin, got dict"):
        Accelerator(cpu=True, torch_tp_plugin={"tp_size": 2})
    Accelerator(cpu=True, torch_tp_plugin=None)  # what transformers' Trainer passes every time
