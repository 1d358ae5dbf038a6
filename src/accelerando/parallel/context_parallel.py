"""Context parallelism: torch's `context_parallel` splits the sequence of the given buffers along the
`cp` mesh and, for the block's duration, runs scaled-dot-product attention on the sequence shards.

On CUDA torch rewrites the flash / efficient / cuDNN attention kernels into ring attention. torch
2.13 has no such rewrite for CPU's kernel (`_scaled_dot_product_flash_attention_for_cpu` has no
DTensor sharding rule at all), so on CPU the block runs attention through the math backend, where
DTensor gathers the keys and values: exact for attention without a mask, but a causal or masked
attention is refused (the mask is a plain tensor DTensor cannot mix in, and the load-balanced
sequence order would make a full-length causal mask wrong). Other devices are refused. The checks on
the buffers (one sequence dim each, lengths divisible by 2 x cp_size for the load-balanced split,
`no_restore_buffers` among `buffers`) are pure and run first.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from accelerando.parallel.mesh import ParallelMesh

CP_DEVICES = ("cuda", "cpu")  # cuda: ring attention; cpu: gathered keys and values, no mask
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
            f"rewrites attention for {', '.join(CP_DEVICES)} only"
        )
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import set_rotate_method

    set_rotate_method(comm_strategy)
    block = context_parallel(
        mesh["cp"], buffers=buffers, buffer_seq_dims=seq_dims, no_restore_buffers=no_restore
    )
    return block if device.type == "cuda" else _unmasked_math_attention(block, cp)


@contextlib.contextmanager
def _unmasked_math_attention(block: contextlib.AbstractContextManager[Any], cp: int) -> Iterator[None]:
    """torch's block, with its patched `scaled_dot_product_attention` run on the math backend and a
    causal or masked call refused, naming why (CPU)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with block:
        patched = F.scaled_dot_product_attention  # torch's context-parallel wrapper

        def attention(
            query: Any, key: Any, value: Any, attn_mask: Any = None, *args: Any, **kwargs: Any
        ) -> Any:
            is_causal = kwargs.get("is_causal", args[1] if len(args) > 1 else False)
            if attn_mask is not None or is_causal:
                raise RuntimeError(
                    f"context parallelism (cp_size={cp}) on cpu runs attention without a mask only: torch "
                    "2.13's ring attention exists for CUDA's flash / efficient / cuDNN kernels, and on CPU the "
                    "sharded keys and values are gathered by DTensor, which cannot apply a causal or explicit "
                    "mask to the load-balanced sequence; run causal attention with context parallelism on CUDA"
                )
            with sdpa_kernel(SDPBackend.MATH):
                return patched(query, key, value, attn_mask, *args, **kwargs)

        F.scaled_dot_product_attention = attention  # type: ignore[assignment]
        try:
            yield
        finally:
            F.scaled_dot_product_attention = patched  # torch's exit restores the original
