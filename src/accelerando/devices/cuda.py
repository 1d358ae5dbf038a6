"""NVIDIA CUDA (and ROCm, which presents itself as cuda)."""

from __future__ import annotations

from accelerando.devices.base import Device


class CudaDevice(Device):
    type = "cuda"
    dist_backend = "nccl"
    rng_type = "cuda"
