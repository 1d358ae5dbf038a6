"""The registry of training objects the checkpointer saves: what one `Accelerator` prepared.

The facade appends to these lists as it prepares; the checkpointer reads them, in order, and
never sees the facade itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from accelerando._runtime import GradientRuntime
    from accelerando.devices.base import Device


@dataclass
class TrainingObjects:
    models: list[torch.nn.Module] = field(default_factory=list)
    optimizers: list[Any] = field(default_factory=list)  # AcceleratedOptimizer (`.optimizer` is the user's)
    schedulers: list[Any] = field(default_factory=list)
    dataloaders: list[Any] = field(default_factory=list)
    custom: list[Any] = field(default_factory=list)  # register_for_checkpointing
    step: int = 0  # `Accelerator.step`: micro-batches since the last optimizer step
    log_step: int = 0  # the step `Accelerator.log(step=None)` gives next: a resumed run continues its curves
    gradient: GradientRuntime | None = None  # the accumulation window, saved so a resume syncs on time
    device_kind: Device | None = None  # whose generators the RNG state includes

    def counts(self, models: int) -> dict[str, int]:
        return {
            "models": models,
            "optimizers": len(self.optimizers),
            "schedulers": len(self.schedulers),
            "dataloaders": len(self.dataloaders),
            "custom_objects": len(self.custom),
        }

    def owner_of(self, optimizer: Any) -> torch.nn.Module | None:
        """The prepared model whose parameters `optimizer` updates (strategies need the pair)."""
        params = {id(p) for g in optimizer.param_groups for p in g["params"]}
        for model in self.models:
            if any(id(p) in params for p in model.parameters()):
                return model
        return self.models[0] if len(self.models) == 1 else None

    def clear(self) -> None:
        for objects in (self.models, self.optimizers, self.schedulers, self.dataloaders):
            objects.clear()
        self.step = 0
