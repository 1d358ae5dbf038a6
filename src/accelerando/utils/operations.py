"""Accelerate's `utils.operations` names: collectives and tree walks from `accelerando.ops`, plus the
small helpers below that only this compatibility surface needs."""

from __future__ import annotations

import functools
import pickle
from collections.abc import Callable, Mapping
from typing import Any

import torch

from accelerando.ops.collectives import (
    broadcast,
    broadcast_object_list,
    gather,
    gather_object,
    pad_across_processes,
    reduce,
)
from accelerando.ops.errors import CannotPadNestedTensorWarning, DistributedOperationException
from accelerando.ops.tree import (
    concatenate,
    convert_to_fp32,
    find_batch_size,
    honor_type,
    is_namedtuple,
    recursively_apply,
    send_to_device,
    slice_tensors,
)
from accelerando.utils.dataclasses import TensorInformation
from accelerando.utils.deepspeed import GatheredParameters  # noqa: F401 - Accelerate exports it here


def listify(data: Any) -> Any:
    """The same structure with every tensor turned into (nested) Python numbers, e.g. for JSON logs."""

    def to_list(tensor: torch.Tensor) -> Any:
        tensor = tensor.detach().cpu()
        if tensor.dtype == torch.bfloat16:  # numpy, behind tolist, has no bfloat16
            tensor = tensor.float()
        return tensor.tolist()

    return recursively_apply(to_list, data)


def find_device(data: Any) -> torch.device | None:
    """Device of the first tensor found in a nested dict/list/tuple, or None when there is none."""
    if isinstance(data, torch.Tensor):
        return data.device
    children = data.values() if isinstance(data, Mapping) else data if isinstance(data, list | tuple) else ()
    for child in children:
        device = find_device(child)
        if device is not None:
            return device
    return None


def pad_input_tensors(tensor: Any, batch_size: int, num_processes: int, dim: int = 0) -> Any:
    """Zero-pad every tensor along `dim` from `batch_size` up to the next multiple of `num_processes`.

    Used to split a batch evenly between processes (or pipeline chunks); a batch that already
    divides evenly is returned unchanged.
    """
    if num_processes < 1:
        raise ValueError(f"num_processes must be at least 1, got {num_processes}")
    target = -(-batch_size // num_processes) * num_processes if batch_size > 0 else num_processes

    def pad(t: torch.Tensor) -> torch.Tensor:
        if t.shape[dim] >= target:
            return t
        shape = list(t.shape)
        shape[dim] = target
        out = t.new_zeros(shape)
        out.narrow(dim, 0, t.shape[dim]).copy_(t)
        return out

    return recursively_apply(pad, tensor, error_on_other_type=True)


class ConvertOutputsToFp32:
    """A forward function whose fp16/bf16 outputs come back as fp32 (what autocast forwards promise).

    Pickling it is refused: a model prepared for mixed precision must be unwrapped before pickling.
    """

    def __init__(self, model_forward: Callable[..., Any]) -> None:
        self.model_forward = model_forward
        functools.update_wrapper(self, model_forward)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return convert_to_fp32(self.model_forward(*args, **kwargs))

    def __getstate__(self) -> Any:
        raise pickle.PicklingError(
            "Cannot pickle a prepared model with automatic mixed precision, please unwrap the model with "
            "`Accelerator.unwrap_model(model)` before pickling it."
        )


def convert_outputs_to_fp32(model_forward: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a forward so its half-precision outputs are cast to fp32; `__wrapped__` is the converter."""
    converter = ConvertOutputsToFp32(model_forward)

    def forward(*args: Any, **kwargs: Any) -> Any:
        return converter(*args, **kwargs)

    forward.__wrapped__ = converter  # type: ignore[attr-defined]
    return forward


def copy_tensor_to_devices(tensor: torch.Tensor | None = None) -> torch.Tensor:
    """The one rank holding `tensor` sends it to all; the others pass None and need not know its shape."""
    import torch.distributed as dist

    from accelerando.state import PartialState

    state = PartialState()
    if state.num_processes == 1:
        if tensor is None:
            raise ValueError("copy_tensor_to_devices: no process holds a tensor (got None)")
        return tensor
    meta = (tuple(tensor.shape), tensor.dtype) if tensor is not None else None
    everyone: list[Any] = [None] * state.num_processes
    dist.all_gather_object(everyone, meta)
    holders = [rank for rank, m in enumerate(everyone) if m is not None]
    if len(holders) != 1:
        raise DistributedOperationException(
            f"copy_tensor_to_devices needs exactly one process holding a tensor, the others passing None; "
            f"processes {holders} hold one"
        )
    shape, dtype = everyone[holders[0]]
    out = (
        tensor.clone(memory_format=torch.contiguous_format)
        if tensor is not None
        else torch.zeros(shape, dtype=dtype, device=state.device)
    )
    dist.broadcast(out, src=holders[0])
    return out


__all__ = [
    "is_torch_tensor",
    "is_tensor_information",
    "initialize_tensors",
    "ignorant_find_batch_size",
    "get_data_structure",
    "CannotPadNestedTensorWarning",
    "ConvertOutputsToFp32",
    "DistributedOperationException",
    "broadcast",
    "broadcast_object_list",
    "concatenate",
    "convert_outputs_to_fp32",
    "convert_to_fp32",
    "copy_tensor_to_devices",
    "find_batch_size",
    "find_device",
    "gather",
    "gather_object",
    "honor_type",
    "is_namedtuple",
    "listify",
    "pad_across_processes",
    "pad_input_tensors",
    "recursively_apply",
    "reduce",
    "send_to_device",
    "slice_tensors",
]


def is_torch_tensor(tensor: Any) -> bool:
    return isinstance(tensor, torch.Tensor)


def is_tensor_information(tensor_info: Any) -> bool:
    return isinstance(tensor_info, TensorInformation)


def get_data_structure(data: Any) -> Any:
    """The same nest with each tensor replaced by its `TensorInformation` (shape, dtype): what a
    process needs to allocate the tensors another one will send."""
    return recursively_apply(lambda t: TensorInformation(shape=t.shape, dtype=t.dtype), data)


def initialize_tensors(data_structure: Any) -> Any:
    """Empty tensors (torch's default device) shaped as the `TensorInformation`s of a nest."""
    return recursively_apply(
        lambda info: torch.empty(info.shape, dtype=info.dtype),
        data_structure,
        test_type=is_tensor_information,
    )


def ignorant_find_batch_size(data: Any) -> int | None:
    """`find_batch_size`, or None where that raises (no tensor in the nest, an empty one)."""
    try:
        return find_batch_size(data)
    except (ValueError, TypeError):
        return None
