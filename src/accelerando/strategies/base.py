"""The Strategy interface: how models and optimizers are distributed, synced, stepped and saved.

The facade never asks which strategy it has; it reads `capabilities` and calls these methods.
FSDP2 and DeepSpeed implement the same interface, with `prepare` receiving every model and
optimizer together so they can be wrapped jointly.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from accelerando.config.options import DistributedType
from accelerando.precision.base import Precision


@dataclass(frozen=True)
class Capabilities:
    """What a strategy does itself instead of the facade."""

    prepares_model_and_optimizer_together: bool = False
    owns_gradient_accumulation: bool = False
    owns_backward: bool = False
    shards_parameters: bool = False
    owns_mixed_precision: bool = False


@dataclass(frozen=True)
class StrategyContext:
    device: torch.device
    world_size: int
    rank: int
    precision: Precision
    backend: str | None


class Strategy:
    """Single device, no wrapping. Subclasses override what they change."""

    name = "single_device"
    capabilities = Capabilities()

    def __init__(self, ctx: StrategyContext) -> None:
        self.ctx = ctx

    @property
    def distributed_type(self) -> DistributedType:
        return DistributedType.NO

    def setup_environment(self) -> None:
        """Runs once the process group exists and before any `prepare`."""

    def prepare(
        self,
        models: list[torch.nn.Module],
        optimizers: list[torch.optim.Optimizer],
        *,
        evaluation_mode: bool = False,
    ) -> tuple[list[torch.nn.Module], list[torch.optim.Optimizer]]:
        """Wrap models (and re-bind optimizers when parameters change); models are on the device already."""
        return [self.wrap_model(m, evaluation_mode=evaluation_mode) for m in models], optimizers

    def wrap_model(self, model: torch.nn.Module, *, evaluation_mode: bool = False) -> torch.nn.Module:
        return model

    @contextlib.contextmanager
    def no_sync(self, model: torch.nn.Module) -> Iterator[None]:
        yield

    def backward(self, loss: torch.Tensor, model: torch.nn.Module | None = None, **kwargs: Any) -> None:
        self.ctx.precision.scale(loss).backward(**kwargs)

    def optimizer_step(self, optimizer: torch.optim.Optimizer, closure: Any = None) -> bool:
        return self.ctx.precision.step(optimizer, closure)

    def clip_grad_norm_(
        self, parameters: Iterable[torch.nn.Parameter], max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor:
        return torch.nn.utils.clip_grad_norm_(list(parameters), max_norm, norm_type=norm_type)

    def clip_grad_value_(self, parameters: Iterable[torch.nn.Parameter], clip_value: float) -> None:
        torch.nn.utils.clip_grad_value_(list(parameters), clip_value)

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return model

    # ---- checkpoint hooks: the checkpointer calls these, never inspects the strategy -----------
    @property
    def sharded_checkpoint(self) -> bool:
        """True when `save_state` should write per-rank shards through torch.distributed.checkpoint."""
        return False

    def model_state_dict(self, model: torch.nn.Module, *, full: bool = True) -> dict[str, Any]:
        """Model weights. `full=True`: unsharded tensors on CPU, complete at least on rank 0
        (sharding strategies may return `{}` elsewhere); `full=False`: this rank's shards (DTensors)."""
        return self.unwrap(model).state_dict()

    def load_model_state_dict(
        self, model: torch.nn.Module, state_dict: dict[str, Any], *, full: bool = True, strict: bool = True
    ) -> Any:
        """Inverse of `model_state_dict`; with `full=True` a sharding strategy reads rank 0's copy."""
        return self.unwrap(model).load_state_dict(state_dict, strict=strict)

    def optimizer_state_dict(
        self, model: torch.nn.Module | None, optimizer: torch.optim.Optimizer, *, full: bool = True
    ) -> dict[str, Any]:
        return optimizer.state_dict()

    def load_optimizer_state_dict(
        self,
        model: torch.nn.Module | None,
        optimizer: torch.optim.Optimizer,
        state_dict: dict[str, Any],
        *,
        full: bool = True,
    ) -> None:
        optimizer.load_state_dict(state_dict)

    @property
    def data_parallel_rank(self) -> int:
        return self.ctx.rank

    @property
    def data_parallel_size(self) -> int:
        return self.ctx.world_size

    def teardown(self) -> None:
        """Release what `prepare` created (engines, hooks)."""
