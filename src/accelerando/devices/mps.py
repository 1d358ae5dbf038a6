"""Apple MPS: one device, no collective backend of its own."""

from __future__ import annotations

import torch

from accelerando.devices.base import Device


class MpsDevice(Device):
    type = "mps"
    dist_backend = "gloo"
    rng_type = "mps"

    def device_count(self) -> int:
        return 1 if self.is_available() else 0

    def torch_device(self, index: int | None = None) -> torch.device:
        return torch.device("mps")

    def set_current(self, index: int) -> None:
        return None

    def mem_get_info(self, index: int = 0) -> tuple[int, int]:
        total = int(self.module().recommended_max_memory())
        return total - int(self.module().current_allocated_memory()), total
