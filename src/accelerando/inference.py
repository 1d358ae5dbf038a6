"""Accelerate's `accelerate.inference` names; defined in `accelerando.parallel.pipeline`."""

from accelerando.parallel.pipeline import (
    build_pipeline,
    find_pippy_batch_size,
    generate_device_map,
    pippy_forward,
    prepare_pippy,
)

__all__ = ["build_pipeline", "find_pippy_batch_size", "generate_device_map", "pippy_forward", "prepare_pippy"]
