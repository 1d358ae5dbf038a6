"""Activation checkpointing: recompute a block's activations in backward instead of keeping them.

Each block's `forward` is replaced, on the instance, by one that runs the original through
`torch.utils.checkpoint.checkpoint` (non-reentrant). Nothing is wrapped, so parameter names
(optimizer re-binding, state-dict keys) do not change, and `torch.compile` traces the call as its
activation-checkpoint operator. The hook-based `torch.distributed._composable.checkpoint` is not
used: under a compiled model its recomputation does not match the forward (torch 2.13 raises
"Recomputed values ... have different metadata"). Applied before compile and before sharding, per
the composition order in DESIGN.md; FSDP2's hooks stay outside the checkpointed region, so the
recomputation runs on parameters FSDP2 has gathered for the backward.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

_MARK = "_accelerando_checkpointed_forward"


def is_checkpointed(module: torch.nn.Module) -> bool:
    return _MARK in module.__dict__


def apply_activation_checkpointing(modules: Iterable[torch.nn.Module]) -> int:
    """Checkpoint each module's forward; returns how many were newly checkpointed."""
    count = 0
    for module in modules:
        if is_checkpointed(module):
            continue
        original = module.forward
        module.__dict__[_MARK] = original
        module.forward = _checkpointed(original)  # type: ignore[method-assign]
        count += 1
    return count


def _checkpointed(forward: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return run
