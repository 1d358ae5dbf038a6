"""fp8 training through torchao's float8 Linear layers (the backend that runs everywhere torch does).

Layers are swapped in `convert_module`, before any wrapping; compute stays in the model's dtype
elsewhere, so no autocast is needed.
"""

from __future__ import annotations

from typing import Any

import torch

from accelerando.precision.base import Precision


def default_fp8_filter(module: torch.nn.Module, name: str) -> bool:
    """fp8 GEMMs need both Linear dims divisible by 16."""
    if not isinstance(module, torch.nn.Linear):
        return False
    return module.in_features % 16 == 0 and module.out_features % 16 == 0


class TorchAoFp8Precision(Precision):
    name = "fp8"

    def __init__(self, config: Any = None, module_filter_fn: Any = None) -> None:
        try:
            from torchao.float8 import Float8LinearConfig
        except ImportError as err:
            raise ImportError("mixed_precision='fp8' needs torchao: pip install 'accelerando[fp8]'") from err
        self.config = config or Float8LinearConfig()
        self.module_filter_fn = module_filter_fn or default_fp8_filter

    def convert_module(self, model: torch.nn.Module) -> torch.nn.Module:
        from torchao.float8 import convert_to_float8_training

        return convert_to_float8_training(model, config=self.config, module_filter_fn=self.module_filter_fn)
