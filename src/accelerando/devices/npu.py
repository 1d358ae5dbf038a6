"""Ascend NPU (torch_npu registers the module)."""

from __future__ import annotations

from accelerando.devices.base import Device


class NpuDevice(Device):
    type = "npu"
    dist_backend = "hccl"
    rng_type = "npu"
