"""fp8 training through NVIDIA Transformer Engine (CUDA, compute capability >= 8.9).

Written against TE's documented PyTorch API: `transformer_engine.pytorch.Linear` / `.LayerNorm`
(constructed with `params_dtype`), `transformer_engine.common.recipe.DelayedScaling` / `Format`, and
`transformer_engine.pytorch.fp8_autocast(enabled=, fp8_recipe=)`. Eligible `nn.Linear` (both dims
divisible by 16) and `nn.LayerNorm` layers are replaced once, before any wrapping, by TE modules
holding copies of their weights under the same names; the forward then runs under `fp8_autocast`
(in training, and in evaluation only with `use_autocast_during_eval`), inside bf16 autocast as
Accelerate runs it (TE takes its activation dtype from torch.autocast). TE cannot be installed on a
machine without CUDA, so the CPU tests run this code against a recorded fake of that API.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any

import torch

from accelerando.config.options import TERecipeKwargs
from accelerando.precision.base import Precision
from accelerando.precision.fp8 import bf16_autocast, default_fp8_filter


def delayed_scaling(recipe: TERecipeKwargs) -> Any:
    """The `DelayedScaling` recipe for these fields (they must be filled: `config.fp8.complete_recipe`)."""
    from transformer_engine.common.recipe import DelayedScaling, Format

    kwargs: dict[str, Any] = {
        "margin": recipe.margin,
        "fp8_format": getattr(Format, str(recipe.fp8_format)),
        "amax_history_len": recipe.amax_history_len,
        "amax_compute_algo": recipe.amax_compute_algo,
        "override_linear_precision": tuple(recipe.override_linear_precision or (False, False, False)),
    }
    if recipe.interval not in (None, 1):  # TE 2 dropped `interval`; pass it only where it exists
        if "interval" not in inspect.signature(DelayedScaling).parameters:
            raise ValueError(
                f"interval={recipe.interval}: this Transformer Engine's DelayedScaling has no `interval` "
                "(it recomputes scales every step); leave interval at 1"
            )
        kwargs["interval"] = recipe.interval
    return DelayedScaling(**kwargs)


def _te_linear(te: Any, layer: torch.nn.Linear) -> torch.nn.Module:
    new = te.Linear(
        layer.in_features, layer.out_features, bias=layer.bias is not None, params_dtype=layer.weight.dtype
    )
    with torch.no_grad():
        new.weight.copy_(layer.weight)
        if layer.bias is not None:
            new.bias.copy_(layer.bias)
    return new  # type: ignore[no-any-return]


def _te_layer_norm(te: Any, layer: torch.nn.LayerNorm) -> torch.nn.Module | None:
    if len(layer.normalized_shape) != 1 or layer.weight is None or layer.bias is None:
        return None  # te.LayerNorm is affine over the last dimension only
    new = te.LayerNorm(layer.normalized_shape[0], eps=layer.eps, params_dtype=layer.weight.dtype)
    with torch.no_grad():
        new.weight.copy_(layer.weight)
        new.bias.copy_(layer.bias)
    return new  # type: ignore[no-any-return]


def convert_to_te(model: torch.nn.Module, te: Any, module_filter: Any = default_fp8_filter) -> int:
    """Replace eligible Linear / LayerNorm children of `model` (recursively); returns how many."""
    count = 0
    for parent_name, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            full = f"{parent_name}.{name}" if parent_name else name
            new: torch.nn.Module | None = None
            if type(child) is torch.nn.Linear and module_filter(child, full):
                new = _te_linear(te, child)
            elif type(child) is torch.nn.LayerNorm:
                new = _te_layer_norm(te, child)
            if new is not None:
                new.train(child.training)
                setattr(parent, name, new)
                count += 1
    return count


class TransformerEngineFp8Precision(Precision):
    name = "fp8"
    backend = "te"
    strategies = ("single_device", "ddp", "fsdp2", "deepspeed")
    replaces_parameters = True

    compute_dtype = torch.bfloat16

    def __init__(self, recipe: TERecipeKwargs, device_type: str = "cuda") -> None:
        import transformer_engine.pytorch as te

        self.device_type = device_type
        self.te = te
        self.recipe = recipe
        self.fp8_recipe = delayed_scaling(recipe)
        self.use_during_eval = bool(recipe.use_autocast_during_eval)

    @property
    def wraps_forward(self) -> bool:
        return True

    def convert_module(self, model: torch.nn.Module) -> torch.nn.Module:
        if getattr(model, "_accelerando_te_converted", False):
            return model
        convert_to_te(model, self.te)
        model._accelerando_te_converted = True  # type: ignore[assignment]
        return model

    def autocast(
        self, enabled: bool = True, cache_enabled: bool | None = None
    ) -> contextlib.AbstractContextManager:
        return self._contexts(enabled, enabled, cache_enabled)

    def forward_context(self, model: torch.nn.Module) -> contextlib.AbstractContextManager:
        return self._contexts(True, model.training or self.use_during_eval)

    @contextlib.contextmanager
    def _contexts(self, bf16: bool, fp8: bool, cache_enabled: bool | None = None) -> Iterator[None]:
        with bf16_autocast(self.device_type, bf16, cache_enabled):
            with self.te.fp8_autocast(enabled=fp8, fp8_recipe=self.fp8_recipe):
                yield
