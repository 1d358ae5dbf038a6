"""Putting one named tensor of a module on a device, or replacing its value; moving nested inputs."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

_INT_PREFIXES = ("torch.uint", "torch.int", "torch.bool")
DeviceLike = torch.device | str | int


def as_torch_device(device: DeviceLike) -> torch.device:
    """Device-map value -> torch.device (an int is an index of the machine's accelerator)."""
    if isinstance(device, torch.device):
        return device
    if isinstance(device, int) and not isinstance(device, bool):
        from accelerando.devices import accelerator_device

        accel = accelerator_device()
        if accel.type == "cpu":
            raise ValueError(f"device {device} is an accelerator index but this machine has no accelerator")
        return accel.torch_device(device)
    if isinstance(device, str) and device != "disk":
        return torch.device(device)
    raise ValueError(f"{device!r} is not a device; use an accelerator index, 'cpu', 'mps' or a torch.device")


def set_module_tensor_to_device(
    module: nn.Module,
    tensor_name: str,
    device: DeviceLike,
    value: torch.Tensor | None = None,
    dtype: torch.dtype | str | None = None,
    fp16_statistics: torch.Tensor | None = None,
    tied_params_map: dict[int, dict[torch.device, torch.Tensor]] | None = None,
    non_blocking: bool = False,
    clear_cache: bool = True,
) -> None:
    """Set `module.<tensor_name>` to `value` (or its current value) on `device`, keeping its kind.

    Without `dtype`, a floating `value` is cast to the dtype the tensor had (the model decides);
    integer and bool values are never cast. `tied_params_map` lets tied offloaded weights share one
    device copy. Parameters stay Parameters (same `requires_grad`), buffers stay buffers.
    """
    parent, name = _resolve(module, tensor_name)
    is_buffer = name in parent._buffers
    old = parent._buffers[name] if is_buffer else parent._parameters[name]
    if old is None:
        raise ValueError(f"{tensor_name!r} is None in {type(parent).__name__}; nothing to place")
    if value is not None:
        check_shape(tensor_name, tuple(old.shape), tuple(value.shape))
    new = old if value is None else value
    target_dtype = _target_dtype(old, new, dtype)
    target = torch.device("meta") if device == "meta" else as_torch_device(device)
    new = _to(new, target, target_dtype, non_blocking, tied_params_map)
    if is_buffer:
        parent._buffers[name] = new
    elif isinstance(old, nn.Parameter) and not isinstance(new, nn.Parameter):
        parent._parameters[name] = type(old)(new, requires_grad=old.requires_grad and new.is_floating_point())
    else:
        parent._parameters[name] = new  # type: ignore[assignment]
    if fp16_statistics is not None:
        parent._parameters[name].SCB = fp16_statistics.to(target)  # type: ignore[union-attr]


def check_shape(tensor_name: str, expected: tuple[int, ...], got: tuple[int, ...]) -> None:
    """A value must have the shape of the tensor it replaces."""
    if expected != got:
        raise ValueError(f"value for {tensor_name!r} has shape {got} but the model expects {expected}")


def _resolve(module: nn.Module, tensor_name: str) -> tuple[nn.Module, str]:
    module_name, _, name = tensor_name.rpartition(".")
    try:
        parent = module.get_submodule(module_name) if module_name else module
    except AttributeError:
        raise ValueError(
            f"{type(module).__name__} has no submodule {module_name!r} (for {tensor_name!r})"
        ) from None
    if name not in parent._parameters and name not in parent._buffers:
        raise ValueError(
            f"{type(parent).__name__} ({module_name or 'root'}) has no parameter or buffer {name!r}"
        )
    return parent, name


def _target_dtype(
    old: torch.Tensor, new: torch.Tensor, dtype: torch.dtype | str | None
) -> torch.dtype | None:
    if str(new.dtype).startswith(_INT_PREFIXES) or not new.is_floating_point():
        return None
    if dtype is None:
        return old.dtype if old.is_floating_point() else None
    if isinstance(dtype, str):
        found = getattr(torch, dtype.replace("torch.", ""), None)
        if not isinstance(found, torch.dtype):
            raise ValueError(f"dtype {dtype!r} is not a torch dtype")
        return found
    return dtype


def _to(
    tensor: torch.Tensor,
    device: torch.device,
    dtype: torch.dtype | None,
    non_blocking: bool,
    tied_params_map: dict[int, dict[torch.device, torch.Tensor]] | None,
) -> torch.Tensor:
    if device.type == "meta":
        return tensor.to("meta", dtype=dtype) if tensor.device.type != "meta" or dtype else tensor
    key = tensor.data_ptr() if tensor.device.type != "meta" else None
    if tied_params_map is not None and key in tied_params_map and device in tied_params_map[key]:
        return tied_params_map[key][device]
    if tensor.device.type == "meta":
        raise ValueError(
            "cannot move a tensor from 'meta' without a value; pass value= (e.g. from a checkpoint)"
        )
    moved = tensor.to(device, dtype=dtype, non_blocking=non_blocking)
    if tied_params_map is not None and key in tied_params_map:
        tied_params_map[key][device] = moved
    return moved


def send_to_device(
    data: Any, device: DeviceLike | None, non_blocking: bool = False, skip_keys: Any = None
) -> Any:
    """Move the tensors in nested inputs to `device`; a no-op for None or tensors already there."""
    if device is None:
        return data
    if isinstance(data, torch.Tensor):
        target = as_torch_device(device)
        same = data.device == target or (data.device.type == target.type and target.index is None)
        return data if same else data.to(target, non_blocking=non_blocking)
    if isinstance(data, (list, tuple)):
        items = [send_to_device(x, device, non_blocking) for x in data]
        return type(data)(*items) if hasattr(data, "_fields") else type(data)(items)
    if isinstance(data, Mapping):
        skip = {skip_keys} if isinstance(skip_keys, str) else set(skip_keys or ())
        out = {k: v if k in skip else send_to_device(v, device, non_blocking) for k, v in data.items()}
        if type(data) is dict:
            return out
        return _rebuild_mapping(data, out)
    return data


def _rebuild_mapping(data: Mapping, values: dict) -> Any:
    try:
        rebuilt: Any = type(data)
        return rebuilt(values)
    except TypeError:
        return values


@contextmanager
def align_module_device(module: nn.Module, execution_device: DeviceLike | None = None) -> Iterator[None]:
    """Within the block the module's (possibly offloaded) tensors are materialised on a device."""
    hook = getattr(module, "_hf_hook", None)
    if hook is not None and getattr(hook, "offload", False):
        previous = hook.execution_device
        if execution_device is not None:
            hook.execution_device = execution_device
        try:
            hook.pre_forward(module)
            yield
        finally:
            hook.post_forward(module, None)
            hook.execution_device = previous
        return
    if execution_device is None:
        yield
        return
    original = {name: t.device for name, t in module.named_parameters(recurse=False)}
    for name in original:
        set_module_tensor_to_device(module, name, execution_device)
    try:
        yield
    finally:
        for name, dev in original.items():
            set_module_tensor_to_device(module, name, dev)
