"""fp8 training through torchao's float8 Linear layers (the backend that runs everywhere torch does).

Layers are swapped in `convert_module`, before any wrapping; the swap keeps each Linear's own
weight Parameter, so optimizers built before `prepare`, `state_dict()` keys and `save_model` output
stay those of the plain model. As in Accelerate, the rest of the forward runs under bf16 autocast
(attention, norms, activations in bf16; the fp8 GEMMs take their inputs from it). Under FSDP2, `enable_fsdp_float8_all_gather` makes `fully_shard` all-gather the weights in fp8.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import torch

from accelerando.config.options import AORecipeKwargs
from accelerando.precision.base import Precision


def bf16_autocast(
    device_type: str, enabled: bool = True, cache_enabled: bool | None = None
) -> contextlib.AbstractContextManager:
    """What Accelerate runs every fp8 backend's forward under (besides the backend's own fp8 layers)."""
    return torch.autocast(device_type, dtype=torch.bfloat16, enabled=enabled, cache_enabled=cache_enabled)


def default_fp8_filter(module: torch.nn.Module, name: str) -> bool:
    """fp8 GEMMs need both Linear dims divisible by 16."""
    if not isinstance(module, torch.nn.Linear):
        return False
    return module.in_features % 16 == 0 and module.out_features % 16 == 0


def float8_config(recipe: AORecipeKwargs) -> Any:
    """The recipe's `Float8LinearConfig`: the one given, else built from its name and switches."""
    try:
        from torchao.float8 import Float8LinearConfig
    except ImportError as err:
        raise ImportError(
            "mixed_precision='fp8' with torchao needs torchao: pip install 'accelerando[fp8]'"
        ) from err
    if recipe.config is not None:
        return recipe.config
    config = Float8LinearConfig.from_recipe_name(recipe.recipe_name or "tensorwise")
    switches = {
        "pad_inner_dim": recipe.pad_inner_dim,
        "enable_fsdp_float8_all_gather": recipe.enable_fsdp_float8_all_gather,
    }
    switches = {k: v for k, v in switches.items() if v is not None}
    if switches.get("enable_fsdp_float8_all_gather") and recipe.recipe_name not in (None, "tensorwise"):
        raise ValueError(
            f"enable_fsdp_float8_all_gather needs the tensorwise recipe (torchao); got recipe_name={recipe.recipe_name!r}"
        )
    return dataclasses.replace(config, **switches) if switches else config


class TorchAoFp8Precision(Precision):
    name = "fp8"
    backend = "ao"
    strategies = ("single_device", "ddp", "fsdp2", "deepspeed")

    compute_dtype = torch.bfloat16

    def __init__(self, recipe: AORecipeKwargs | None = None, device_type: str = "cpu") -> None:
        recipe = recipe or AORecipeKwargs()
        self.config = float8_config(recipe)
        self.module_filter_fn = recipe.module_filter_func or default_fp8_filter
        self.device_type = device_type

    @property
    def wraps_forward(self) -> bool:
        return True

    def autocast(
        self, enabled: bool = True, cache_enabled: bool | None = None
    ) -> contextlib.AbstractContextManager:
        return bf16_autocast(self.device_type, enabled, cache_enabled)

    def convert_module(self, model: torch.nn.Module) -> torch.nn.Module:
        from torchao.float8 import convert_to_float8_training
        from torchao.float8.float8_linear import Float8Linear

        if any(isinstance(m, Float8Linear) for m in model.modules()):
            return model  # converted before (a model prepared twice): never convert twice
        return convert_to_float8_training(model, config=self.config, module_filter_fn=self.module_filter_fn)
