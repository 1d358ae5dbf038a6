"""Device kinds over `torch.accelerator` / `torch.get_device_module`."""

from accelerando.devices.base import Device
from accelerando.devices.registry import DEVICES, accelerator_device, get_device

__all__ = ["DEVICES", "Device", "accelerator_device", "get_device"]
