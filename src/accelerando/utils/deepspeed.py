"""Accelerate's `utils.deepspeed` names: placeholders for an optimizer or scheduler that the DeepSpeed
config defines, the wrappers `prepare` returns around an engine's optimizer and scheduler, the active
plugin, and ZeRO-3's gather context.

`DummyOptim` / `DummyScheduler` only carry what `prepare` needs to let DeepSpeed build the real ones
from the config's `optimizer` / `scheduler` sections; `prepare` returns the real ones, wrapped.
The wrappers keep Accelerate's names and types because libraries test for them (transformers'
Trainer: `isinstance(lr_scheduler, DeepSpeedSchedulerWrapper)`) and reach through them
(`wrapper.engine`, `wrapper.optimizer`, `wrapper.scheduler`).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterable
from typing import Any

from accelerando.config.deepspeed import DeepSpeedPlugin, HfDeepSpeedConfig
from accelerando.optimizer import AcceleratedOptimizer
from accelerando.scheduler import AcceleratedScheduler

__all__ = [
    "DeepSpeedEngineWrapper",
    "DeepSpeedOptimizerWrapper",
    "DeepSpeedPlugin",
    "DeepSpeedSchedulerWrapper",
    "DummyOptim",
    "DummyScheduler",
    "GatheredParameters",
    "HfDeepSpeedConfig",
    "get_active_deepspeed_plugin",
    "map_pytorch_optim_to_deepspeed",
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


class DeepSpeedEngineWrapper:
    """A DeepSpeed engine driven the way Accelerate's loop drives it: `backward` marks whether this
    micro-batch ends the accumulation window, runs the engine's backward and, at the end of the
    window, the engine's step (clipping from the config, optimizer, scheduler, zeroing)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def backward(self, loss: Any, sync_gradients: bool = True, **kwargs: Any) -> None:
        self.engine.set_gradient_accumulation_boundary(is_boundary=sync_gradients)
        self.engine.backward(loss, **kwargs)
        if sync_gradients:
            self.engine.step()

    def get_global_grad_norm(self) -> float | None:
        """The pre-clip gradient norm of the engine's last step (None before any)."""
        norm = self.engine.get_global_grad_norm()
        return norm.item() if hasattr(norm, "item") else norm


class DeepSpeedOptimizerWrapper(AcceleratedOptimizer):
    """What `prepare` returns for an engine's optimizer. The engine clears gradients itself, so
    `zero_grad` does nothing; `step` steps the engine once per accumulation window, unless
    `clip_grad_norm_` (or a `DeepSpeedEngineWrapper.backward`) already did."""

    def __init__(self, optimizer: Any) -> None:
        super().__init__(optimizer, device_placement=False, scaler=None)

    def zero_grad(self, set_to_none: bool | None = None) -> None:
        """Nothing to do: the engine zeroed the gradients when it stepped."""

    @property
    def step_was_skipped(self) -> bool:
        """Whether the engine skipped its last step (fp16 overflow)."""
        return self._step_was_skipped or bool(getattr(self.optimizer, "overflow", False))


class DeepSpeedSchedulerWrapper(AcceleratedScheduler):
    """What `prepare` returns for a scheduler the engine owns (one the config or a `DummyScheduler`
    defines): `engine.step()` steps it with the optimizer, so `step` here does nothing."""

    def __init__(self, scheduler: Any, optimizers: Any) -> None:
        super().__init__(scheduler, optimizers)

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to do: the engine stepped its scheduler with the optimizer."""


def get_active_deepspeed_plugin(state: Any) -> DeepSpeedPlugin:
    """The selected plugin of `state` (an AcceleratorState); a ValueError without DeepSpeed."""
    plugin = getattr(state, "deepspeed_plugin", None)
    if plugin is None:
        raise ValueError(
            "no DeepSpeed plugin is active: create the Accelerator with deepspeed_plugin(s)=... or launch with "
            "--use_deepspeed"
        )
    return plugin  # type: ignore[no-any-return]


def deepspeed_cpu_optimizer_class(optimizer: Any) -> tuple[type, dict[str, Any]]:
    """DeepSpeed's CPU optimizer doing `optimizer`'s update, and the keywords that make it the same
    update: torch and 32-bit bitsandbytes Adam/AdamW -> `DeepSpeedCPUAdam` (`adamw_mode` says which:
    decoupled weight decay), torch and 32-bit bitsandbytes Adagrad -> `DeepSpeedCPUAdagrad`, 32-bit
    bitsandbytes Lion -> `DeepSpeedCPULion`. Importing them builds nothing; building one JIT-compiles
    its op. A setting the CPU optimizers lack (amsgrad, maximize, Adagrad's lr_decay and initial
    accumulator) is refused rather than silently dropped."""
    import torch

    kind = type(optimizer)
    name, from_bnb = kind.__name__, kind.__module__.startswith("bitsandbytes")
    lacking = ("amsgrad", "maximize", "lr_decay", "initial_accumulator_value")
    unmatched = [k for k in lacking if any(g.get(k) for g in optimizer.param_groups)]
    if unmatched:
        raise ValueError(f"DeepSpeed's CPU optimizers have no {' or '.join(unmatched)}; {name} uses it")
    bits = getattr(optimizer, "optim_bits", getattr(getattr(optimizer, "args", None), "optim_bits", 32))
    defaults = {k: v for k, v in optimizer.defaults.items() if k in ("lr", "weight_decay")}
    if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)) or (
        from_bnb and "Adam" in name and bits == 32
    ):
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        adamw = isinstance(optimizer, torch.optim.AdamW) or "AdamW" in name
        adamw = adamw or optimizer.defaults.get("decoupled_weight_decay")
        return DeepSpeedCPUAdam, {**defaults, "adamw_mode": bool(adamw)}
    if isinstance(optimizer, torch.optim.Adagrad) or (from_bnb and "Adagrad" in name and bits == 32):
        from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad

        return DeepSpeedCPUAdagrad, defaults
    if from_bnb and "Lion" in name and bits == 32:
        from deepspeed.ops.lion import DeepSpeedCPULion

        return DeepSpeedCPULion, defaults
    raise ValueError(
        f"{kind.__module__}.{name} has no DeepSpeed CPU optimizer to offload to; accepted: torch.optim.Adam, "
        "AdamW, Adagrad and bitsandbytes' 32-bit Adam, AdamW, Adagrad, Lion. Keep your optimizer with "
        '"zero_force_ds_cpu_optimizer": false, or define the optimizer in the DeepSpeed config'
    )


def map_pytorch_optim_to_deepspeed(optimizer: Any) -> Any:
    """Accelerate's name: `optimizer` rebuilt as DeepSpeed's CPU optimizer on the same parameter
    groups (each group keeps its lr, betas, eps, weight_decay), for ZeRO-Offload with
    `zero_force_ds_cpu_optimizer`. Building it JIT-compiles DeepSpeed's C++ op (minutes, once).
    Unlike Accelerate, an optimizer with no equivalent (SGD...) is refused rather than turned into Adam."""
    cls, kwargs = deepspeed_cpu_optimizer_class(optimizer)
    return cls(optimizer.param_groups, **kwargs)


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
