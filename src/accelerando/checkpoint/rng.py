"""Every random number generator a training step may draw from, as plain data (no pickled objects).

The state is stored per rank (`random_states_{rank}.pkl`, a `torch.save` file of tensors, ints and
tuples) so it loads with `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from accelerando.devices.base import Device


def capture_rng_state(device_kind: Device | None = None) -> dict[str, Any]:
    """Python, numpy, torch (CPU) and the accelerator's generators of this process."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)  # type: ignore[misc]
    state: dict[str, Any] = {
        "python": (version, tuple(internal), gauss),
        "numpy": (
            str(kind),
            torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            int(pos),
            int(has_gauss),
            float(cached),
        ),
        "torch": torch.get_rng_state(),
    }
    if device_kind is not None and device_kind.type != "cpu":
        device_state = device_kind.get_rng_state()
        if device_state is not None:
            state["device"] = {"type": device_kind.type, "state": list(device_state)}
    return state


def restore_rng_state(state: dict[str, Any], device_kind: Device | None = None) -> None:
    """Inverse of `capture_rng_state`; a device state saved on another device type is ignored."""
    version, internal, gauss = state["python"]
    random.setstate((int(version), tuple(int(x) for x in internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), int(pos), int(has_gauss), float(cached)))
    torch.set_rng_state(state["torch"])
    device = state.get("device")
    if device is not None and device_kind is not None and device["type"] == device_kind.type:
        device_kind.set_rng_state(device["state"])


def validate_rng_state(state: Any, name: str) -> None:
    """Shape check before anything is restored, so a damaged file cannot half-apply."""
    if not isinstance(state, dict) or not {"python", "numpy", "torch"} <= set(state):
        raise ValueError(f"{name} does not hold random states (expected keys python, numpy, torch)")
