"""NVIDIA CUDA (and ROCm, which presents itself as cuda)."""

from __future__ import annotations

from accelerando.devices.base import Device


class CudaDevice(Device):
    type = "cuda"
    dist_backend = "nccl"
    rng_type = "cuda"

    def compute_capability(self, index: int = 0) -> tuple[int, int] | None:
        if not self.is_available():
            return None
        major, minor = self.module().get_device_capability(index)
        return int(major), int(minor)
