"""Precision strategies: full, fp16/bf16 autocast (+GradScaler), fp8."""

from accelerando.precision.base import Precision
from accelerando.precision.registry import build_precision, validate_mixed_precision

__all__ = ["Precision", "build_precision", "validate_mixed_precision"]
