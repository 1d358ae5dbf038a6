"""Device kinds by name; adding a backend is a new file and one line here."""

from __future__ import annotations

import torch

from accelerando.devices.base import Device
from accelerando.devices.cpu import CpuDevice
from accelerando.devices.cuda import CudaDevice
from accelerando.devices.mlu import MluDevice
from accelerando.devices.mps import MpsDevice
from accelerando.devices.npu import NpuDevice
from accelerando.devices.xla import XlaDevice
from accelerando.devices.xpu import XpuDevice

DEVICES: dict[str, type[Device]] = {
    "cpu": CpuDevice,
    "cuda": CudaDevice,
    "xpu": XpuDevice,
    "npu": NpuDevice,
    "mlu": MluDevice,
    "mps": MpsDevice,
    "xla": XlaDevice,
}


def get_device(kind: str) -> Device:
    """The Device for a kind name ("cuda", "cpu", ...)."""
    try:
        return DEVICES[kind]()
    except KeyError:
        raise ValueError(f"unknown device kind {kind!r}; accepted: {', '.join(DEVICES)}") from None


def accelerator_device(cpu: bool = False) -> Device:
    """The machine's accelerator as `torch.accelerator` reports it, XLA if present, else the CPU."""
    if cpu:
        return CpuDevice()
    current = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    if current is not None and current.type in DEVICES:
        return get_device(current.type)
    xla = XlaDevice()
    return xla if xla.is_available() else CpuDevice()
