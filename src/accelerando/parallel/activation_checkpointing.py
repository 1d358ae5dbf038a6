"""Activation checkpointing: recompute a block's activations in backward instead of keeping them.

Uses PyTorch's composable `checkpoint`, which hooks the module instead of wrapping it, so parameter
names (and therefore optimizer re-binding and state-dict keys) do not change. Applied before
sharding, per the composition order in DESIGN.md.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


def apply_activation_checkpointing(modules: Iterable[torch.nn.Module]) -> int:
    """Checkpoint each module's forward (non-reentrant); returns how many were hooked."""
    from torch.distributed._composable import checkpoint

    count = 0
    for module in modules:
        checkpoint(module)
        count += 1
    return count
