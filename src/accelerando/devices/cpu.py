"""The host CPU: always available, gloo collectives, no device RNG of its own."""

from __future__ import annotations

from typing import Any

import psutil
import torch

from accelerando.devices.base import Device


class CpuDevice(Device):
    type = "cpu"
    dist_backend = "gloo"

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return 1

    def torch_device(self, index: int | None = None) -> torch.device:
        return torch.device("cpu")

    def set_current(self, index: int) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def memory_stats(self, index: int = 0) -> dict[str, Any]:
        vm = psutil.virtual_memory()
        return {"total": vm.total, "available": vm.available, "used": vm.used}

    def mem_get_info(self, index: int = 0) -> tuple[int, int]:
        vm = psutil.virtual_memory()
        return int(vm.available), int(vm.total)

    def supports_dtype(self, dtype: torch.dtype) -> bool:
        return True

    def get_rng_state(self) -> Any:
        return None

    def set_rng_state(self, state: Any) -> None:
        return None

    def manual_seed_all(self, seed: int) -> None:
        return None

    def new_stream(self, device: torch.device) -> Any | None:
        return None

    def current_stream(self, device: torch.device) -> Any | None:
        return None

    def pinned_empty(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8)

    def reserve_memory(self, nbytes: int, device: torch.device) -> int:
        return 0
