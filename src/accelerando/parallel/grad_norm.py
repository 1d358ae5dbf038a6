"""Gradient norms and clipping over gradients that may be DTensors (FSDP2 shards, tensor-parallel shards).

`torch.nn.utils.clip_grad_norm_` stacks per-tensor norms, which fails when plain tensors and DTensors
on different meshes are mixed (a tensor-parallel model keeps its norms' weights as plain, replicated
tensors). Here each mesh's gradients are reduced on their own and the results combined as plain
numbers, so the norm is that of the whole unsharded gradient on every rank.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (a view: in-place ops change the DTensor), or the tensor itself."""
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def has_dtensor_grads(parameters: list[torch.nn.Parameter]) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(p.grad, DTensor) for p in parameters)


def total_grad_norm(grads: list[torch.Tensor], norm_type: float = 2.0) -> torch.Tensor:
    """p-norm of all gradients as if unsharded: shard norms are combined across ranks, per mesh."""
    from torch.distributed.tensor import DTensor

    norm_type = float(norm_type)
    if not grads:
        return torch.tensor(0.0)
    groups: dict[Any, list[torch.Tensor]] = {}
    for g in grads:
        groups.setdefault(id(g.device_mesh) if isinstance(g, DTensor) else None, []).append(g)
    parts: list[torch.Tensor] = []
    for group in groups.values():
        norm = torch.nn.utils.get_total_norm(group, norm_type)
        parts.append((norm.full_tensor() if isinstance(norm, DTensor) else norm).float().cpu())
    stacked = torch.stack(parts)
    if math.isinf(norm_type):
        return stacked.max()
    return stacked.pow(norm_type).sum().pow(1.0 / norm_type)


def clip_grad_norm_(
    parameters: Iterable[torch.nn.Parameter], max_norm: float, norm_type: float = 2.0
) -> torch.Tensor:
    """Scale every gradient by min(1, max_norm / total norm); returns the total norm as a plain tensor."""
    params = [p for p in parameters if p.grad is not None]
    total = total_grad_norm([p.grad for p in params], norm_type)  # type: ignore[misc]
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    with torch.no_grad():
        for p in params:
            grad = local_tensor(p.grad)  # type: ignore[arg-type]
            grad.mul_(coef.to(grad.device, grad.dtype))
    return total


def clip_grad_value_(parameters: Iterable[torch.nn.Parameter], clip_value: float) -> None:
    with torch.no_grad():
        for p in parameters:
            if p.grad is not None:
                local_tensor(p.grad).clamp_(-clip_value, clip_value)
