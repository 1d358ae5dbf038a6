"""Gradient accumulation windows: when a micro-batch ends one, and how long the current one is."""

from __future__ import annotations

from typing import Any

from accelerando._runtime import GradientRuntime


def window_size(g: GradientRuntime, loader: Any) -> int:
    """Micro-batches in the window starting now: shorter at the end of a loader of known length,
    so that the loss of a partial last window is averaged over its real length."""
    if g.num_steps == 1 or not g.sync_with_dataloader or loader is None:
        return g.num_steps
    try:
        remaining = len(loader) - int(loader.batches_yielded) + 1
    except (TypeError, AttributeError):
        return g.num_steps
    return max(1, min(g.num_steps, remaining))


def advance_window(g: GradientRuntime, loader: Any) -> bool:
    """Count one micro-batch and set `g.sync_gradients`; True when the loader just ended."""
    if g.step_in_window == 0:
        g.window_size = window_size(g, loader)
    g.step_in_window += 1
    at_end = g.sync_with_dataloader and bool(getattr(loader, "end_of_dataloader", False))
    if at_end or g.step_in_window >= g.window_size:
        g.sync_gradients = True
        g.step_in_window = 0
    else:
        g.sync_gradients = False
    return at_end
