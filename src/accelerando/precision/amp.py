"""fp16 / bf16 through `torch.autocast`, with a `torch.amp.GradScaler` for fp16 (on CPU too).

The fp16 step reads one flag from the device per optimizer step (GradScaler's own inf check) and
no more: whether the step was skipped is learned from a step post-hook, not by reading the scale.
"""

from __future__ import annotations

import contextlib
import weakref
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
        self._watches: weakref.WeakKeyDictionary[torch.optim.Optimizer, _StepWatch | None] = (
            weakref.WeakKeyDictionary()
        )

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
        if optimizer not in self._watches:
            self._watches[optimizer] = _StepWatch.attach(optimizer)
        watch = self._watches[optimizer]
        if watch is not None:
            watch.ran = False
        self._scaler.step(optimizer, closure) if closure is not None else self._scaler.step(optimizer)
        stepped = watch.ran if watch is not None else not self._found_inf(optimizer)
        self._scaler.update()
        self._unscaled.discard(id(optimizer))
        return stepped

    def _found_inf(self, optimizer: torch.optim.Optimizer) -> bool:
        """Read the scaler's inf flag (one device read): for optimizers a post-hook cannot watch."""
        found = self._scaler._found_inf_per_device(optimizer)  # type: ignore[union-attr]
        return any(bool(flag.item()) for flag in found.values())

    def fsdp_mixed_precision(self) -> Any:
        from torch.distributed.fsdp import MixedPrecisionPolicy

        return MixedPrecisionPolicy(param_dtype=self.compute_dtype, reduce_dtype=torch.float32)

    def state_dict(self) -> dict[str, Any]:
        return self._scaler.state_dict() if self._scaler is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self._scaler is not None and state:
            self._scaler.load_state_dict(state)


class _StepWatch:
    """Learns whether GradScaler let an optimizer's own `step` run, without touching the device.

    Only for optimizers whose `step` torch wraps with hooks (every `torch.optim.Optimizer` that ran
    `Optimizer.__init__`) and that do not skip inside their own kernel (fused optimizers always run).
    """

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.ran = False
        self.handle = optimizer.register_step_post_hook(self._mark)

    def _mark(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.ran = True

    @classmethod
    def attach(cls, optimizer: torch.optim.Optimizer) -> _StepWatch | None:
        hooked = getattr(type(optimizer).step, "hooked", False)
        if not hooked or getattr(optimizer, "_step_supports_amp_scaling", False):
            return None
        return cls(optimizer)
