"""TPU and other XLA devices through torch_xla (imported only when used)."""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

from accelerando.devices.base import Device


class XlaDevice(Device):
    type = "xla"
    dist_backend = "xla"
    rng_type = "xla"

    def module(self) -> Any:
        import torch_xla.core.xla_model as xm

        return xm

    def is_available(self) -> bool:
        if importlib.util.find_spec("torch_xla") is None:
            return False
        try:
            import torch_xla.runtime as xr

            return bool(xr.device_type())
        except (ImportError, RuntimeError):
            return False

    def device_count(self) -> int:
        if not self.is_available():
            return 0
        import torch_xla.runtime as xr

        return int(xr.addressable_runtime_device_count())

    def torch_device(self, index: int | None = None) -> torch.device:
        return torch.device("xla") if index is None else torch.device("xla", index)

    def set_current(self, index: int) -> None:
        return None

    def synchronize(self) -> None:
        self.module().wait_device_ops()

    def empty_cache(self) -> None:
        return None

    def memory_stats(self, index: int = 0) -> dict[str, Any]:
        return dict(self.module().get_memory_info(self.torch_device(index)))

    def mem_get_info(self, index: int = 0) -> tuple[int, int]:
        info = self.memory_stats(index)
        total = int(info.get("bytes_limit", 0))
        return total - int(info.get("bytes_used", 0)), total

    def get_rng_state(self) -> Any:
        return self.module().get_rng_state()

    def set_rng_state(self, state: Any) -> None:
        self.module().set_rng_state(state)

    def manual_seed_all(self, seed: int) -> None:
        self.module().set_rng_state(seed)
