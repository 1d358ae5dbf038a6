"""Building a model without allocating its weights (meta) or directly on a device."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from accelerando.big_model.tensors import DeviceLike, as_torch_device
from accelerando.config import env


def _include_buffers_default() -> bool:
    return env.flag("INIT_INCLUDE_BUFFERS", default=False)


@contextmanager
def init_empty_weights(include_buffers: bool | None = None) -> Iterator[None]:
    """Create modules on `meta`: no memory, no init time; load real weights later.

    Buffers stay real by default (models compute non-persistent ones such as rotary tables in
    `__init__`); `include_buffers=True` or env `ACCELERANDO_INIT_INCLUDE_BUFFERS=1` puts them on meta too.
    """
    with init_on_device(torch.device("meta"), include_buffers=include_buffers):
        yield


@contextmanager
def init_on_device(device: DeviceLike, include_buffers: bool | None = None) -> Iterator[None]:
    """Every parameter (and buffer, with `include_buffers`) registered inside is created on `device`."""
    target = as_torch_device(device)
    if include_buffers is None:
        include_buffers = _include_buffers_default()
    if include_buffers:
        with target:
            yield
        return
    original = nn.Module.register_parameter

    def register_parameter(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        original(module, name, param)
        if param is None or param.device == target:
            return
        kind = type(param)
        extra = dict(param.__dict__)
        if kind is nn.Parameter:
            moved = nn.Parameter(param.data.to(target), requires_grad=param.requires_grad)
            moved.__dict__.update(extra)
        else:  # subclasses (quantized params) take their attributes as constructor arguments
            moved = kind(param.data.to(target), requires_grad=param.requires_grad, **extra)
        module._parameters[name] = moved

    nn.Module.register_parameter = register_parameter  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[method-assign]
