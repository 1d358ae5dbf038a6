"""fp8 training through Microsoft MS-AMP (CUDA; not published on PyPI).

Written against MS-AMP's documented entry point, `msamp.initialize(model, optimizer, opt_level)`,
which returns the model with fp8 Linear layers and an optimizer that keeps fp8 (O1) or also
low-precision optimizer states (O2). It converts one model and its optimizer together, so both must
come to the same `prepare()` call, and it runs on one device or under DDP (its examples wrap the
initialized model in DDP); FSDP2 and DeepSpeed are refused. The forward runs under bf16 autocast, as
Accelerate runs every fp8 backend. This integration has never run against
the real package: the CPU tests use a recorded fake of `msamp.initialize`.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from accelerando.config.options import MSAMPRecipeKwargs
from accelerando.precision.base import Precision
from accelerando.precision.fp8 import bf16_autocast


class MsampFp8Precision(Precision):
    name = "fp8"
    backend = "msamp"
    strategies = ("single_device", "ddp")

    compute_dtype = torch.bfloat16

    def __init__(self, recipe: MSAMPRecipeKwargs, device_type: str = "cuda") -> None:
        import msamp

        self.device_type = device_type
        self.msamp = msamp
        self.opt_level = recipe.opt_level or "O2"
        self._done: set[int] = set()  # ids of models msamp.initialize returned

    @property
    def wraps_forward(self) -> bool:
        return True

    def autocast(
        self, enabled: bool = True, cache_enabled: bool | None = None
    ) -> contextlib.AbstractContextManager:
        return bf16_autocast(self.device_type, enabled, cache_enabled)

    def initialize(
        self, models: list[torch.nn.Module], optimizers: list[Any]
    ) -> tuple[list[torch.nn.Module], list[Any]]:
        fresh = [m for m in models if id(m) not in self._done]
        if not fresh and not optimizers:
            return models, optimizers
        if len(models) != 1 or len(optimizers) != 1:
            raise ValueError(
                "MS-AMP (fp8 backend 'msamp') converts a model and its optimizer together: pass exactly one "
                f"model and one optimizer to the same prepare() call (got {len(models)} model(s) and "
                f"{len(optimizers)} optimizer(s))"
            )
        model, optimizer = self.msamp.initialize(models[0], optimizers[0], opt_level=self.opt_level)
        self._done.add(id(model))
        return [model], [optimizer]
