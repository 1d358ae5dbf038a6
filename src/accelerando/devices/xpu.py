"""Intel XPU."""

from __future__ import annotations

from accelerando.devices.base import Device


class XpuDevice(Device):
    type = "xpu"
    dist_backend = "xccl"
    rng_type = "xpu"
