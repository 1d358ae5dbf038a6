"""The DeepSpeed config one engine is built with: the plugin's, "auto" filled, contradictions refused.

Pure functions of the plugin, the model's optimizer and scheduler and what the Accelerator knows
(per-rank batch size, accumulation, ranks). Every engine's config of one `prepare` call is computed
before any engine is built, so a contradiction stops `prepare` with nothing built.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from accelerando.config.deepspeed import AUTO, DeepSpeedPlugin, HfDeepSpeedConfig
from accelerando.utils.deepspeed import deepspeed_cpu_optimizer_class, map_pytorch_optim_to_deepspeed

_HIDDEN_SIZE_KEYS = (
    "zero_optimization.reduce_bucket_size",
    "zero_optimization.stage3_prefetch_bucket_size",
    "zero_optimization.stage3_param_persistence_threshold",
)


@dataclass(frozen=True)
class EngineRequest:
    """One model of a `prepare` call, with the optimizer and scheduler that belong to it."""

    model: torch.nn.Module
    optimizer: Any = None  # a torch optimizer, a DummyOptim, or None (inference)
    scheduler: Any = None  # a torch scheduler, a DummyScheduler, or None


def is_dummy(obj: Any, kind: str) -> bool:
    return getattr(type(obj), "prepare_kind", None) == kind and not isinstance(obj, torch.optim.Optimizer)


def micro_batch_size(plugin: DeepSpeedPlugin, batch_sizes: list[int | None]) -> int | None:
    """The per-rank batch of the prepared loaders (the smallest, or the largest without is_train_batch_min)."""
    sizes = [b for b in batch_sizes if b is not None]
    if not sizes:
        return None
    return min(sizes) if plugin.is_train_batch_min else max(sizes)


def engine_config(
    plugin: DeepSpeedPlugin,
    request: EngineRequest,
    *,
    batch_sizes: list[int | None],
    accumulation: int,
    world_size: int,
    split_batches: bool = False,
) -> dict[str, Any]:
    """A copy of the plugin's config with every "auto" filled; a ValueError naming any contradiction."""
    config = HfDeepSpeedConfig(plugin.deepspeed_config)
    _fill_batch(config, micro_batch_size(plugin, batch_sizes), accumulation, world_size, request)
    _fill(config, "gradient_accumulation_steps", accumulation)
    if config.get_value("gradient_clipping") in (None, AUTO):
        # DeepSpeed clips at 1.0 unless told otherwise; "auto" means: clip when clip_grad_norm_ asks.
        config.set_value("gradient_clipping", 0.0)
    _check_optimizer(config, request)
    _fill_model_sizes(config, request.model)
    _fill_dummies(config, request, world_size, split_batches)
    left = _autos(config.config)
    if left:
        raise ValueError(
            f'the DeepSpeed config still has "auto" for {", ".join(left)}, which accelerando cannot fill here; '
            "give these values in the config"
        )
    return config.config


def _fill(config: HfDeepSpeedConfig, key: str, value: Any) -> None:
    if config.get_value(key) == AUTO:
        config.set_value(key, value)


def _fill_batch(
    config: HfDeepSpeedConfig, micro: int | None, accumulation: int, world: int, request: EngineRequest
) -> None:
    given = config.get_value("train_micro_batch_size_per_gpu")
    if given not in (None, AUTO) and micro is not None and int(given) != micro:
        raise ValueError(
            f"the DeepSpeed config's train_micro_batch_size_per_gpu={given} contradicts the prepared data "
            f'loader\'s per-process batch size {micro}; make it "auto" or match the loader'
        )
    if given in (None, AUTO):
        if micro is None and request.optimizer is not None:
            raise ValueError(
                "DeepSpeed needs the per-process batch size: prepare the training DataLoader before (or with) "
                "the model, or set train_micro_batch_size_per_gpu in the DeepSpeed config"
            )
        micro = micro if micro is not None else 1  # an inference engine: the value is only bookkeeping
        config.set_value("train_micro_batch_size_per_gpu", micro)
    micro = int(config.get_value("train_micro_batch_size_per_gpu"))
    total = micro * accumulation * world
    given_total = config.get_value("train_batch_size")
    if given_total in (None, AUTO):
        config.set_value("train_batch_size", total)
    elif int(given_total) != total:
        raise ValueError(
            f"the DeepSpeed config's train_batch_size={given_total} contradicts micro batch {micro} x "
            f'accumulation {accumulation} x {world} processes = {total}; make it "auto"'
        )


def _check_optimizer(config: HfDeepSpeedConfig, request: EngineRequest) -> None:
    """Accelerate's rules: an optimizer or scheduler lives in the config or in the code, not both."""
    optimizer, scheduler = request.optimizer, request.scheduler
    in_config = "optimizer" in config.config
    if optimizer is not None and in_config and not is_dummy(optimizer, "optimizer"):
        raise ValueError(
            "the DeepSpeed config defines an optimizer and the code passed a torch optimizer to prepare(); remove "
            "one of them (use accelerando.utils.DummyOptim to use the config's)"
        )
    if is_dummy(optimizer, "optimizer") and not in_config:
        raise ValueError("a DummyOptim needs an optimizer section in the DeepSpeed config")
    if scheduler is not None:
        dummy = is_dummy(scheduler, "scheduler")
        if "scheduler" in config.config and not dummy:
            raise ValueError(
                "the DeepSpeed config defines a scheduler and the code passed one to prepare(); remove one of "
                "them (use accelerando.utils.DummyScheduler to use the config's)"
            )
        if dummy and "scheduler" not in config.config and scheduler.lr_scheduler_callable is None:
            raise ValueError(
                "a DummyScheduler needs a scheduler section in the DeepSpeed config or lr_scheduler_callable"
            )
        if dummy and not is_dummy(optimizer, "optimizer"):
            raise ValueError("a DummyScheduler goes with a DummyOptim (the config's optimizer)")
    if isinstance(optimizer, torch.optim.Optimizer):
        config.config.setdefault("zero_allow_untested_optimizer", True)
        offload = config.get_value("zero_optimization.offload_optimizer.device", "none")
        if offload not in (None, "none"):
            # Keep the user's optimizer on CPU instead of swapping in DeepSpeedCPUAdam (a JIT-built op).
            config.config.setdefault("zero_force_ds_cpu_optimizer", False)
        if _needs_cpu_optimizer(optimizer, config.config):
            deepspeed_cpu_optimizer_class(optimizer)  # one with no CPU equivalent stops here


def optimizer_for_engine(optimizer: torch.optim.Optimizer, config: dict[str, Any]) -> Any:
    """The optimizer handed to `deepspeed.initialize`: Accelerate's rule, with offload and
    `zero_force_ds_cpu_optimizer` (true only when the config says so here), is DeepSpeed's CPU
    optimizer on the same parameter groups."""
    return map_pytorch_optim_to_deepspeed(optimizer) if _needs_cpu_optimizer(optimizer, config) else optimizer


def _needs_cpu_optimizer(optimizer: torch.optim.Optimizer, config: dict[str, Any]) -> bool:
    """Optimizer offload, forced CPU optimizer, and not one of DeepSpeed's own already."""
    offload = config.get("zero_optimization", {}).get("offload_optimizer", {}).get("device", "none")
    forced = offload not in (None, "none") and config.get("zero_force_ds_cpu_optimizer", False)
    return bool(forced) and not type(optimizer).__module__.startswith("deepspeed.")


def _fill_model_sizes(config: HfDeepSpeedConfig, model: torch.nn.Module) -> None:
    wanted = [k for k in _HIDDEN_SIZE_KEYS if config.get_value(k) == AUTO]
    if not wanted:
        return
    model_config = getattr(model, "config", None)
    hidden = getattr(model_config, "hidden_size", None)
    if hidden is None and getattr(model_config, "hidden_sizes", None):
        hidden = max(model_config.hidden_sizes)  # type: ignore[union-attr]
    if hidden is None:
        raise ValueError(
            f'"auto" for {", ".join(wanted)} is filled from model.config.hidden_size, which this model does '
            "not have; give numbers in the DeepSpeed config"
        )
    values = {
        _HIDDEN_SIZE_KEYS[0]: hidden * hidden,
        _HIDDEN_SIZE_KEYS[1]: int(0.9 * hidden * hidden),
        _HIDDEN_SIZE_KEYS[2]: 10 * hidden,
    }
    for key in wanted:
        config.set_value(key, values[key])


def _fill_dummies(config: HfDeepSpeedConfig, request: EngineRequest, world: int, split_batches: bool) -> None:
    optimizer, scheduler = request.optimizer, request.scheduler
    if is_dummy(optimizer, "optimizer"):
        _fill(config, "optimizer.params.lr", optimizer.lr)
        _fill(config, "optimizer.params.weight_decay", optimizer.weight_decay)
    if is_dummy(scheduler, "scheduler") and scheduler.lr_scheduler_callable is None:
        lr = getattr(scheduler.optimizer, "lr", None)
        _fill(config, "scheduler.params.warmup_min_lr", 0)
        _fill(config, "scheduler.params.warmup_max_lr", lr)
        _fill(config, "scheduler.params.warmup_num_steps", max(1, scheduler.warmup_num_steps))
        if scheduler.total_num_steps is not None:
            total = scheduler.total_num_steps
            _fill(
                config,
                "scheduler.params.total_num_steps",
                total if split_batches else math.ceil(total / world),
            )


def _autos(node: Any, prefix: str = "") -> list[str]:
    if isinstance(node, dict):
        return [k for key, value in node.items() for k in _autos(value, f"{prefix}{key}.")]
    return [prefix[:-1]] if node == AUTO else []
