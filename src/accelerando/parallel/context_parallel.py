"""Context parallelism: torch's `context_parallel` splits the sequence of the given buffers along the
`cp` mesh and rewrites scaled-dot-product attention into ring attention for the block's duration.

torch implements the rewrite for the CUDA flash / efficient attention kernels only, so on any other
device the context is refused with a clear error instead of silently computing unsplit attention;
the checks on the buffers (same count of sequence dims, lengths divisible by 2 x cp_size for the
load-balanced split, `no_restore_buffers` among `buffers`) are pure and run first.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterable
from typing import Any

import torch

from accelerando.parallel.mesh import ParallelMesh

CP_DEVICES = ("cuda",)
_warned = False


def check_buffers(
    cp_size: int, buffers: list[torch.Tensor], seq_dims: list[int], no_restore: Iterable[torch.Tensor]
) -> None:
    """The buffers torch will shard, validated before any work (errors name the sizes)."""
    if len(buffers) != len(seq_dims):
        raise ValueError(
            f"maybe_context_parallel got {len(buffers)} buffers but {len(seq_dims)} buffer_seq_dims; "
            "give one sequence dimension per buffer"
        )
    for i, (buffer, dim) in enumerate(zip(buffers, seq_dims)):
        if not -buffer.dim() <= dim < buffer.dim():
            raise ValueError(f"buffer {i} has shape {tuple(buffer.shape)}: no dimension {dim}")
        if buffer.shape[dim] % (2 * cp_size):
            raise ValueError(
                f"buffer {i} has sequence length {buffer.shape[dim]} (dim {dim}), which must be divisible by "
                f"2 x cp_size = {2 * cp_size} for the load-balanced split; pad the sequence"
            )
    ids = {id(b) for b in buffers}
    if any(id(b) not in ids for b in no_restore):
        raise ValueError("no_restore_buffers must be a subset of buffers (the same tensor objects)")


def context_parallel_context(
    mesh: ParallelMesh,
    device: torch.device,
    comm_strategy: str,
    buffers: list[torch.Tensor] | None = None,
    buffer_seq_dims: list[int] | None = None,
    no_restore_buffers: set[torch.Tensor] | None = None,
) -> contextlib.AbstractContextManager[Any]:
    """The block in which `buffers` are split along `cp` and attention runs as ring attention."""
    global _warned
    cp = mesh.shape.cp
    if cp == 1:
        if not _warned:
            _warned = True
            warnings.warn(
                "Context parallel training is not enabled; maybe_context_parallel has no effect. "
                "Set ParallelismConfig(cp_size > 1) (with FSDP) to enable it.",
                stacklevel=3,
            )
        return contextlib.nullcontext()
    buffers, seq_dims = list(buffers or []), list(buffer_seq_dims or [])
    no_restore = set(no_restore_buffers or set())
    check_buffers(cp, buffers, seq_dims, no_restore)
    if device.type not in CP_DEVICES:
        raise RuntimeError(
            f"context parallelism (cp_size={cp}) cannot run on {device.type}: torch's context_parallel "
            f"rewrites the flash / efficient attention kernels, which exist on {', '.join(CP_DEVICES)} only"
        )
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import set_rotate_method

    set_rotate_method(comm_strategy)
    return context_parallel(
        mesh["cp"], buffers=buffers, buffer_seq_dims=seq_dims, no_restore_buffers=no_restore
    )
