"""Layerwise casting: weights stored in a low-precision dtype, upcast only while their layer runs.

Memory of a model held in e.g. float8 with the arithmetic of bfloat16, without quantization
kernels: each supported leaf layer (`SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING`) converts itself to
the compute dtype before its forward and back to storage after it. Accelerate's names and walk.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import torch
from torch import nn

from accelerando.big_model.hooks import ModelHook, add_hook_to_module
from accelerando.utils.constants import SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING

logger = logging.getLogger(__name__)


class LayerwiseCastingHook(ModelHook):
    """Keep the module in `storage_dtype`; run its forward in `compute_dtype`."""

    _is_stateful = False

    def __init__(self, storage_dtype: torch.dtype, compute_dtype: torch.dtype, non_blocking: bool) -> None:
        self.storage_dtype = storage_dtype
        self.compute_dtype = compute_dtype
        self.non_blocking = non_blocking

    def init_hook(self, module: nn.Module) -> nn.Module:
        return module.to(dtype=self.storage_dtype, non_blocking=self.non_blocking)

    # Casting a module's weights is left out of compiled graphs. `torch._disable_dynamo` is
    # `torch.compiler.disable` that loads torch._dynamo at the first call, not at import (about a
    # second every `import accelerando` would pay); torch's own `Optimizer` uses it the same way.
    @torch._disable_dynamo
    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        module.to(dtype=self.compute_dtype, non_blocking=self.non_blocking)
        return args, kwargs

    @torch._disable_dynamo
    def post_forward(self, module: nn.Module, output: Any) -> Any:
        module.to(dtype=self.storage_dtype, non_blocking=self.non_blocking)
        return output


def attach_layerwise_casting_hooks(
    module: nn.Module,
    storage_dtype: torch.dtype,
    compute_dtype: torch.dtype,
    skip_modules_pattern: str | tuple[str, ...] | None = None,
    skip_modules_classes: tuple[type[nn.Module], ...] | None = None,
    non_blocking: bool = False,
) -> None:
    """Hook every supported layer of `module` (the module itself when it is one), except those whose
    qualified name matches a `skip_modules_pattern` regex or whose class is in `skip_modules_classes`
    (a skipped module's children are skipped too, and keep their dtype)."""
    patterns = (skip_modules_pattern,) if isinstance(skip_modules_pattern, str) else skip_modules_pattern
    stack: list[tuple[str, nn.Module]] = [("", module)]
    while stack:
        name, current = stack.pop()
        skipped = (skip_modules_classes is not None and isinstance(current, skip_modules_classes)) or any(
            re.search(p, name) for p in patterns or ()
        )
        if skipped:
            logger.debug('Skipping layerwise casting for layer "%s"', name)
        elif isinstance(current, SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING):
            logger.debug('Applying layerwise casting to layer "%s"', name)
            hook = LayerwiseCastingHook(storage_dtype, compute_dtype, non_blocking)
            add_hook_to_module(current, hook, append=True)
        else:
            children = [(f"{name}.{child}" if name else child, m) for child, m in current.named_children()]
            stack += reversed(children)  # visit in definition order
