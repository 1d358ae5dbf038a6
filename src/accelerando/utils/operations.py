"""Accelerate's `utils.operations` names, defined in `accelerando.ops`."""

from accelerando.ops.collectives import (
    broadcast,
    broadcast_object_list,
    gather,
    gather_object,
    pad_across_processes,
    reduce,
)
from accelerando.ops.tree import (
    concatenate,
    convert_to_fp32,
    find_batch_size,
    is_namedtuple,
    recursively_apply,
    send_to_device,
    slice_tensors,
)

__all__ = [
    "broadcast",
    "broadcast_object_list",
    "concatenate",
    "convert_to_fp32",
    "find_batch_size",
    "gather",
    "gather_object",
    "is_namedtuple",
    "pad_across_processes",
    "recursively_apply",
    "reduce",
    "send_to_device",
    "slice_tensors",
]
