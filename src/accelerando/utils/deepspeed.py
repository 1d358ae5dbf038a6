"""Accelerate's `utils.deepspeed` names: placeholders for an optimizer or scheduler that the DeepSpeed
config defines, the active plugin, and ZeRO-3's gather context.

`DummyOptim` / `DummyScheduler` only carry what `prepare` needs to let DeepSpeed build the real ones
from the config's `optimizer` / `scheduler` sections; `prepare` returns the real ones.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterable
from typing import Any

from accelerando.config.deepspeed import DeepSpeedPlugin, HfDeepSpeedConfig

__all__ = [
    "DeepSpeedPlugin",
    "DeepSpeedSchedulerWrapper",
    "DummyOptim",
    "DummyScheduler",
    "GatheredParameters",
    "HfDeepSpeedConfig",
    "get_active_deepspeed_plugin",
]


class DummyOptim:
    """Stands for the optimizer of the DeepSpeed config; its `lr` / `weight_decay` fill that section's "auto"."""

    prepare_kind = "optimizer"  # how `Accelerator.prepare` recognises it (it is no torch Optimizer)

    def __init__(
        self, params: Iterable[Any], lr: float = 0.001, weight_decay: float = 0, **kwargs: Any
    ) -> None:
        self.params = list(params)
        self.lr = lr
        self.weight_decay = weight_decay
        self.kwargs = kwargs


class DummyScheduler:
    """Stands for the scheduler of the DeepSpeed config, or `lr_scheduler_callable(optimizer)`."""

    prepare_kind = "scheduler"

    def __init__(
        self,
        optimizer: DummyOptim,
        total_num_steps: int | None = None,
        warmup_num_steps: int = 0,
        lr_scheduler_callable: Callable[[Any], Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self.optimizer = optimizer
        self.total_num_steps = total_num_steps
        self.warmup_num_steps = warmup_num_steps
        self.lr_scheduler_callable = lr_scheduler_callable
        self.kwargs = kwargs


class DeepSpeedSchedulerWrapper:
    """What `prepare` returns for a scheduler the engine owns (Accelerate's name; transformers'
    Trainer checks for it): `engine.step()` already steps it."""

    _step_count = 0  # what AcceleratedScheduler advances on skipped micro-steps; the engine counts its own

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.optimizer = engine.optimizer

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to do: the engine stepped its scheduler with the optimizer."""

    def get_last_lr(self) -> list[float]:
        return list(self.engine.lr_scheduler.get_last_lr())

    def state_dict(self) -> dict[str, Any]:
        return dict(self.engine.lr_scheduler.state_dict())

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.engine.lr_scheduler.load_state_dict(state_dict)


def get_active_deepspeed_plugin(state: Any) -> DeepSpeedPlugin:
    """The selected plugin of `state` (an AcceleratorState); a ValueError without DeepSpeed."""
    plugin = getattr(state, "deepspeed_plugin", None)
    if plugin is None:
        raise ValueError(
            "no DeepSpeed plugin is active: create the Accelerator with deepspeed_plugin(s)=... or launch with "
            "--use_deepspeed"
        )
    return plugin  # type: ignore[no-any-return]


def GatheredParameters(  # noqa: N802 - Accelerate's (and DeepSpeed's) name
    params: Any, modifier_rank: int | None = None, fwd_module: Any = None, enabled: bool = True
) -> contextlib.AbstractContextManager[Any]:
    """DeepSpeed's `zero.GatheredParameters` for ZeRO-3 partitioned parameters; a no-op otherwise."""
    if "deepspeed" not in sys.modules:  # nothing can be partitioned: do not import it for nothing
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(  # type: ignore[no-any-return]
        params, modifier_rank=modifier_rank, fwd_module=fwd_module, enabled=enabled
    )
