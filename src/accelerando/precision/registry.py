"""Build the Precision for a `mixed_precision` name."""

from __future__ import annotations

from accelerando.config.options import AORecipeKwargs, AutocastKwargs, GradScalerKwargs, PrecisionType
from accelerando.precision.amp import AmpPrecision
from accelerando.precision.base import Precision


def validate_mixed_precision(value: object) -> str:
    name = "no" if value is None else str(value).lower()
    if name not in PrecisionType:
        raise ValueError(
            f"mixed_precision={value!r} is not supported; accepted: {', '.join(PrecisionType.list())}"
        )
    return name


def build_precision(
    name: str,
    device_type: str,
    autocast_kwargs: AutocastKwargs | None = None,
    scaler_kwargs: GradScalerKwargs | None = None,
    fp8_recipe: AORecipeKwargs | None = None,
) -> Precision:
    if name == "no":
        return Precision()
    if name in ("fp16", "bf16"):
        return AmpPrecision(name, device_type, autocast_kwargs, scaler_kwargs)
    if name == "fp8":
        from accelerando.precision.fp8 import TorchAoFp8Precision

        recipe = fp8_recipe or AORecipeKwargs()
        return TorchAoFp8Precision(recipe.config, recipe.module_filter_func)
    raise AssertionError(name)
