"""`AcceleratedOptimizer`: steps and zeroes only on accumulation boundaries, through the precision."""

from __future__ import annotations

from typing import Any

import torch

from accelerando import _runtime


class AcceleratedOptimizer(torch.optim.Optimizer):
    """Wraps a user optimizer; everything not overridden here is the wrapped optimizer's own."""

    def __init__(
        self, optimizer: torch.optim.Optimizer, device_placement: bool = True, scaler: Any = None
    ) -> None:
        # Deliberately not calling Optimizer.__init__: state lives in the wrapped optimizer.
        self.optimizer = optimizer
        self.scaler = scaler
        self.device_placement = device_placement
        self._runtime = _runtime.require_runtime()
        self._step_was_skipped = False

    # The wrapped optimizer's data, seen through the wrapper (schedulers read these).
    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.optimizer.state

    @state.setter
    def state(self, value: Any) -> None:
        self.optimizer.state = value

    @property
    def param_groups(self) -> Any:  # type: ignore[override]
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: Any) -> None:
        self.optimizer.param_groups = value

    @property
    def defaults(self) -> Any:  # type: ignore[override]
        return self.optimizer.defaults

    @defaults.setter
    def defaults(self, value: Any) -> None:
        self.optimizer.defaults = value

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self.optimizer.add_param_group(param_group)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state_dict)

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def _boundary(self) -> bool:
        """True on the micro-step that ends a window (or always, when the strategy accumulates)."""
        rt = self._runtime
        if rt.gradient.sync_gradients:
            return True
        strategy = rt.strategy
        return strategy is not None and strategy.capabilities.owns_gradient_accumulation

    def zero_grad(self, set_to_none: bool = True) -> None:
        if not self._boundary():
            return
        strategy = self._runtime.strategy
        if strategy is None:
            self.optimizer.zero_grad(set_to_none=set_to_none)
        else:
            strategy.zero_grad(self.optimizer, set_to_none)

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        if not self._boundary():
            return
        strategy = self._runtime.strategy
        if strategy is None:
            self.optimizer.step(closure)
            self._step_was_skipped = False
            return
        self._step_was_skipped = not strategy.optimizer_step(self.optimizer, closure)

    @property
    def step_was_skipped(self) -> bool:
        """Whether the last step was skipped because fp16 gradients overflowed."""
        return self._step_was_skipped

    def train(self) -> None:
        if hasattr(self.optimizer, "train"):
            self.optimizer.train()

    def eval(self) -> None:
        if hasattr(self.optimizer, "eval"):
            self.optimizer.eval()

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_runtime"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._runtime = _runtime.require_runtime()

    def __repr__(self) -> str:
        return f"AcceleratedOptimizer({self.optimizer!r})"
