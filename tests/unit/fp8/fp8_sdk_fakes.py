"""Recorded fakes of the two fp8 SDKs that cannot be installed on a machine without CUDA.

Each mimics the documented call surface accelerando uses, and records how it was called:
- Transformer Engine (`transformer_engine.pytorch.Linear(in, out, bias=, params_dtype=)`,
  `.LayerNorm(hidden, eps=, params_dtype=)`, `.fp8_autocast(enabled=, fp8_recipe=)`,
  `transformer_engine.common.recipe.DelayedScaling(margin=, fp8_format=, amax_history_len=,
  amax_compute_algo=, override_linear_precision=)` and `Format`); like TE 2.x, each module carries
  its fp8 scaling state as `_extra_state` in the state dict: an empty uint8 tensor until it has
  run under fp8, then its pickled state as a uint8 tensor whose length changes as it trains;
- MS-AMP (`msamp.initialize(model, optimizer, opt_level=)` -> (model with its Linear layers replaced,
  a new optimizer over the replaced model's parameters)).
The math is plain fp32, so a run through accelerando can be compared exactly with the same steps
done by hand. Nothing here claims the real SDKs behave numerically like this.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import importlib.machinery
import pickle
import sys
import types
from collections.abc import Iterator
from typing import Any

import torch


def _module(name: str, **attrs: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    module.__path__ = []  # type: ignore[attr-defined]
    module.__dict__.update(attrs)
    return module


class Calls:
    """What the fake SDK was asked to do."""

    def __init__(self) -> None:
        self.autocast: list[tuple[bool, Any]] = []  # (enabled, recipe) per fp8_autocast entry
        self.fp8_forwards = 0  # Linear forwards run inside an enabled fp8_autocast
        self.plain_forwards = 0
        self.initialize: list[tuple[Any, Any, str]] = []  # msamp.initialize(model, optimizer, opt_level)
        self.active: list[bool] = []


def install_transformer_engine(monkeypatch: Any) -> Calls:
    calls = Calls()

    class Format(enum.Enum):
        E4M3 = "E4M3"
        E5M2 = "E5M2"
        HYBRID = "HYBRID"

    @dataclasses.dataclass
    class DelayedScaling:
        margin: int = 0
        fp8_format: Format = Format.HYBRID
        amax_history_len: int = 1024
        amax_compute_algo: str = "max"
        override_linear_precision: tuple[bool, bool, bool] = (False, False, False)
        reduce_amax: bool = True

    class ExtraState(torch.nn.Module):
        """TE's `_extra_state`: the amax seen by each fp8 forward (the real one keeps scales too)."""

        def _record_amax(self, x: torch.Tensor) -> None:
            self.amax_history = [*getattr(self, "amax_history", []), float(x.detach().abs().max())]

        def get_extra_state(self) -> torch.Tensor:
            history = getattr(self, "amax_history", None)
            if not history:
                return torch.empty(0, dtype=torch.uint8)
            return torch.frombuffer(bytearray(pickle.dumps({"amax_history": history})), dtype=torch.uint8)

        def set_extra_state(self, state: Any) -> None:
            if not isinstance(state, torch.Tensor):
                raise RuntimeError("Unsupported checkpoint format.")  # TE's own words
            if state.numel():
                self.amax_history = pickle.loads(state.numpy().tobytes())["amax_history"]  # noqa: S301

    class Linear(ExtraState):
        def __init__(
            self, in_features: int, out_features: int, bias: bool = True, params_dtype: Any = None, **_: Any
        ) -> None:
            super().__init__()
            self.in_features, self.out_features = in_features, out_features
            dtype = params_dtype or torch.float32
            self.weight = torch.nn.Parameter(torch.empty(out_features, in_features, dtype=dtype))
            self.bias = torch.nn.Parameter(torch.empty(out_features, dtype=dtype)) if bias else None

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if calls.active and calls.active[-1]:
                calls.fp8_forwards += 1
                self._record_amax(x)
            else:
                calls.plain_forwards += 1
            return torch.nn.functional.linear(x, self.weight, self.bias)

    class LayerNorm(ExtraState):
        def __init__(self, hidden_size: int, eps: float = 1e-5, params_dtype: Any = None, **_: Any) -> None:
            super().__init__()
            self.eps = eps
            self.weight = torch.nn.Parameter(torch.empty(hidden_size, dtype=params_dtype or torch.float32))
            self.bias = torch.nn.Parameter(torch.empty(hidden_size, dtype=params_dtype or torch.float32))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)

    @contextlib.contextmanager
    def fp8_autocast(enabled: bool = True, fp8_recipe: Any = None, **_: Any) -> Iterator[None]:
        calls.autocast.append((enabled, fp8_recipe))
        calls.active.append(enabled)
        try:
            yield
        finally:
            calls.active.pop()

    recipe = _module("transformer_engine.common.recipe", DelayedScaling=DelayedScaling, Format=Format)
    common = _module("transformer_engine.common", recipe=recipe)
    pytorch = _module(
        "transformer_engine.pytorch", Linear=Linear, LayerNorm=LayerNorm, fp8_autocast=fp8_autocast
    )
    root = _module("transformer_engine", pytorch=pytorch, common=common)
    for module in (root, common, recipe, pytorch):
        monkeypatch.setitem(sys.modules, module.__name__, module)
    return calls


def install_msamp(monkeypatch: Any) -> Calls:
    calls = Calls()

    class FP8Linear(torch.nn.Linear):
        """Stands for msamp.nn.FP8Linear (same parameters, fp8 weights in the real one)."""

    def initialize(model: torch.nn.Module, optimizer: Any = None, opt_level: str = "O1", **_: Any) -> Any:
        calls.initialize.append((model, optimizer, opt_level))
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is torch.nn.Linear:
                    new = FP8Linear(child.in_features, child.out_features, bias=child.bias is not None)
                    new.load_state_dict(child.state_dict())
                    setattr(parent, name, new)
        groups = [
            {**{k: v for k, v in g.items() if k != "params"}, "params": []} for g in optimizer.param_groups
        ]
        groups[0]["params"] = list(model.parameters())
        new_optimizer = type(optimizer)(groups[:1], lr=groups[0]["lr"])
        return model, new_optimizer

    root = _module("msamp", initialize=initialize, FP8Linear=FP8Linear)
    monkeypatch.setitem(sys.modules, "msamp", root)
    return calls
