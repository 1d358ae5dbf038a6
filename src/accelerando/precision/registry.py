"""Build the Precision for a `mixed_precision` name (and, for fp8, the backend the probe allows)."""

from __future__ import annotations

from accelerando.config.env import EnvSettings
from accelerando.config.fp8 import Fp8Request, complete_recipe
from accelerando.config.options import (
    AutocastKwargs,
    GradScalerKwargs,
    MSAMPRecipeKwargs,
    PrecisionType,
    TERecipeKwargs,
)
from accelerando.precision.amp import AmpPrecision
from accelerando.precision.base import Precision
from accelerando.precision.fp8_probe import PREFERENCE, Fp8Facts, choose_backend, gather_facts


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
    fp8: Fp8Request | None = None,
    facts: Fp8Facts | None = None,
) -> Precision:
    """`facts` (tests) replaces what the probe reads from this machine."""
    if name == "no":
        return Precision()
    if name in ("fp16", "bf16"):
        return AmpPrecision(name, device_type, autocast_kwargs, scaler_kwargs)
    if name == "fp8":
        return build_fp8(fp8 or Fp8Request(None, {}), device_type, facts)
    raise AssertionError(name)


def build_fp8(request: Fp8Request, device_type: str, facts: Fp8Facts | None = None) -> Precision:
    """The probe picks (or checks) the backend; its recipe comes completed from `config.fp8`."""
    candidates = (
        (request.requested,) if request.requested is not None else tuple(request.recipes) or PREFERENCE
    )
    facts = facts or gather_facts(device_type, candidates)
    backend = choose_backend(request.requested, facts)
    recipe = request.recipes.get(backend) or complete_recipe(backend, None, EnvSettings())
    if isinstance(recipe, TERecipeKwargs):
        from accelerando.precision.fp8_te import TransformerEngineFp8Precision

        return TransformerEngineFp8Precision(recipe, device_type)
    if isinstance(recipe, MSAMPRecipeKwargs):
        from accelerando.precision.fp8_msamp import MsampFp8Precision

        return MsampFp8Precision(recipe, device_type)
    from accelerando.precision.fp8 import TorchAoFp8Precision

    return TorchAoFp8Precision(recipe, device_type)
