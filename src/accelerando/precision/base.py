"""The Precision interface: how a model computes and how its gradients are scaled and stepped."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

STRATEGY_NAMES = {
    "single_device": "single-device",
    "ddp": "DDP",
    "fsdp2": "FSDP2 (fully_shard)",
    "deepspeed": "DeepSpeed",
}


class Precision:
    """Full precision: every hook is the identity. Mixed precision overrides what it needs."""

    name = "no"
    compute_dtype: torch.dtype | None = None
    backend: str | None = None  # fp8 only: "ao", "te", "msamp"
    strategies: tuple[str, ...] | None = None  # the strategies it composes with (None: every one)
    replaces_parameters = False  # convert_module puts new Parameters in place (optimizers are rebound)

    def check_strategy(self, strategy: str) -> None:
        """Refuse, before any work, a strategy this precision cannot run under (naming both)."""
        if self.strategies is not None and strategy not in self.strategies:
            raise ValueError(
                f"mixed_precision={self.name!r} with fp8 backend {self.backend!r} does not support the "
                f"{STRATEGY_NAMES.get(strategy, strategy)} strategy; it runs with "
                f"{', '.join(STRATEGY_NAMES.get(s, s) for s in self.strategies)}"
            )

    def initialize(
        self, models: list[torch.nn.Module], optimizers: list[Any]
    ) -> tuple[list[torch.nn.Module], list[Any]]:
        """Convert models and optimizers together, before any wrapping (MS-AMP); identity otherwise."""
        return models, optimizers

    def forward_context(self, model: torch.nn.Module) -> contextlib.AbstractContextManager:
        """The context one forward of `model` runs in (may depend on `model.training`)."""
        return self.autocast()

    def convert_module(self, model: torch.nn.Module) -> torch.nn.Module:
        """Swap layers before wrapping (fp8 replaces Linear); identity otherwise."""
        return model

    def autocast(
        self, enabled: bool = True, cache_enabled: bool | None = None
    ) -> contextlib.AbstractContextManager:
        """A fresh context manager for one forward (cheap: it runs on every step)."""
        return contextlib.nullcontext()

    @property
    def wraps_forward(self) -> bool:
        """Whether prepared models run their forward under `autocast()`."""
        return False

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        return None

    def step(self, optimizer: torch.optim.Optimizer, closure: Any = None) -> bool:
        """Step the optimizer; return False when the step was skipped (fp16 overflow)."""
        optimizer.step(closure) if closure is not None else optimizer.step()
        return True

    @property
    def scaler(self) -> Any:
        return None

    def fsdp_mixed_precision(self) -> Any:
        """The FSDP2 `MixedPrecisionPolicy` equivalent of this precision, or None."""
        return None

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None
