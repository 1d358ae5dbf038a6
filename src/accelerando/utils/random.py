"""Seeding and RNG synchronisation across every source a training step may draw from."""

from __future__ import annotations

import random

import numpy as np
import torch

from accelerando import _runtime


def set_seed(seed: int, device_specific: bool = False, deterministic: bool = False) -> None:
    """Seed python, numpy, torch and every available accelerator.

    `device_specific=True` adds the process index so ranks draw different numbers (augmentation);
    `deterministic=True` also asks torch for deterministic kernels.
    """
    if device_specific:
        runtime = _runtime.current()
        seed += runtime.topology.rank if runtime is not None else 0
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA/XPU/... device
    runtime = _runtime.current()
    if runtime is not None and runtime.device.type != "cpu":
        runtime.device_kind.manual_seed_all(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True)


def synchronize_rng_state(rng_type: str = "torch", generator: torch.Generator | None = None) -> None:
    """Give every rank the main process's state of one RNG."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    if rng_type == "torch":
        state = [torch.get_rng_state()]
        dist.broadcast_object_list(state, src=0)
        torch.set_rng_state(state[0])
    elif rng_type == "generator":
        if generator is None:
            raise ValueError("synchronize_rng_state('generator') needs the generator to synchronise")
        state = [generator.get_state()]
        dist.broadcast_object_list(state, src=0)
        generator.set_state(state[0])
    else:
        runtime = _runtime.require_runtime()
        if runtime.device_kind.rng_type != rng_type:
            raise ValueError(
                f"rng type {rng_type!r} does not match this process's device ({runtime.device.type}); "
                "accepted: 'torch', 'generator' or the device's own"
            )
        state = [runtime.device_kind.get_rng_state()]
        dist.broadcast_object_list(state, src=0)
        runtime.device_kind.set_rng_state(state[0])


def synchronize_rng_states(rng_types: list[str], generator: torch.Generator | None = None) -> None:
    for rng_type in rng_types:
        synchronize_rng_state(str(rng_type), generator=generator)
