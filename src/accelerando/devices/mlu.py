"""Cambricon MLU (torch_mlu registers the module)."""

from __future__ import annotations

from accelerando.devices.base import Device


class MluDevice(Device):
    type = "mlu"
    dist_backend = "cncl"
    rng_type = "mlu"
