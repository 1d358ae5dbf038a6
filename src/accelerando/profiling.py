"""`Accelerator.profile()`: a `torch.profiler.profile` built from `ProfileKwargs`, one trace per rank."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from accelerando.config.options import ProfileKwargs

_ACTIVITIES = {
    "cpu": "CPU",
    "cuda": "CUDA",
    "xpu": "XPU",
    "mtia": "MTIA",
    "hpu": "HPU",
}


def profiler_activities(names: list[str] | None) -> list[Any] | None:
    """The `ProfilerActivity` values for `names`; None (torch's default: every available one) for None."""
    from torch.profiler import ProfilerActivity

    if names is None:
        return None
    chosen = []
    for name in names:
        attr = _ACTIVITIES.get(str(name).lower())
        if attr is None or not hasattr(ProfilerActivity, attr):
            raise ValueError(
                f"profiler activity {name!r} is not supported; accepted: {', '.join(_ACTIVITIES)}"
            )
        chosen.append(getattr(ProfilerActivity, attr))
    return chosen


def build_profiler(handler: ProfileKwargs) -> torch.profiler.profile:
    schedule = torch.profiler.schedule(**handler.schedule_option) if handler.schedule_option else None
    return torch.profiler.profile(
        activities=profiler_activities(handler.activities),
        schedule=schedule,
        on_trace_ready=handler.on_trace_ready,
        record_shapes=handler.record_shapes,
        profile_memory=handler.profile_memory,
        with_stack=handler.with_stack,
        with_flops=handler.with_flops,
        with_modules=handler.with_modules,
    )


@contextmanager
def profile(handler: ProfileKwargs | None, process_index: int) -> Iterator[torch.profiler.profile]:
    """Profile the block; with `output_trace_dir`, write `profile_<rank>.json` (a Chrome trace)."""
    handler = handler or ProfileKwargs()
    prof = build_profiler(handler)
    with prof:
        yield prof
    if handler.output_trace_dir:
        os.makedirs(handler.output_trace_dir, exist_ok=True)
        target = os.path.join(handler.output_trace_dir, f"profile_{process_index}.json")
        tmp = target + ".tmp.json"
        prof.export_chrome_trace(tmp)
        os.replace(tmp, target)
