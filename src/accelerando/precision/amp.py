"""fp16 / bf16 through `torch.autocast`, with a `torch.amp.GradScaler` for fp16 (on CPU too)."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from accelerando.config.options import AutocastKwargs, GradScalerKwargs
from accelerando.precision.base import Precision


class AmpPrecision(Precision):
    def __init__(
        self,
        name: str,
        device_type: str,
        autocast_kwargs: AutocastKwargs | None = None,
        scaler_kwargs: GradScalerKwargs | None = None,
        use_scaler: bool | None = None,
    ) -> None:
        self.name = name
        self.compute_dtype = torch.float16 if name == "fp16" else torch.bfloat16
        self.device_type = device_type
        self.autocast_kwargs = autocast_kwargs or AutocastKwargs()
        want_scaler = (name == "fp16") if use_scaler is None else use_scaler
        self._scaler = (
            torch.amp.GradScaler(device_type, **(scaler_kwargs or GradScalerKwargs()).to_dict())
            if want_scaler
            else None
        )
        self._unscaled: set[int] = set()

    @property
    def scaler(self) -> Any:
        return self._scaler

    @property
    def wraps_forward(self) -> bool:
        return self.autocast_kwargs.enabled

    def autocast(
        self, enabled: bool = True, cache_enabled: bool | None = None
    ) -> contextlib.AbstractContextManager:
        return torch.autocast(
            self.device_type, dtype=self.compute_dtype, enabled=enabled, cache_enabled=cache_enabled
        )

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return self._scaler.scale(loss) if self._scaler is not None else loss

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        # GradScaler refuses a second unscale_ of the same optimizer within one step.
        if self._scaler is not None and id(optimizer) not in self._unscaled:
            self._scaler.unscale_(optimizer)
            self._unscaled.add(id(optimizer))

    def step(self, optimizer: torch.optim.Optimizer, closure: Any = None) -> bool:
        if self._scaler is None:
            return super().step(optimizer, closure)
        scale_before = self._scaler.get_scale()
        self._scaler.step(optimizer, closure) if closure is not None else self._scaler.step(optimizer)
        self._scaler.update()
        self._unscaled.discard(id(optimizer))
        return not self._scaler.get_scale() < scale_before

    def fsdp_mixed_precision(self) -> Any:
        from torch.distributed.fsdp import MixedPrecisionPolicy

        return MixedPrecisionPolicy(param_dtype=self.compute_dtype, reduce_dtype=torch.float32)

    def state_dict(self) -> dict[str, Any]:
        return self._scaler.state_dict() if self._scaler is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self._scaler is not None and state:
            self._scaler.load_state_dict(state)
