"""Freeing memory and retrying with smaller batches after out-of-memory errors."""

from __future__ import annotations

import functools
import gc
import inspect
from collections.abc import Callable
from typing import Any

from accelerando import _runtime

_OOM_MARKERS = ("out of memory", "cudnn_status_not_supported", "dcu out of memory", "can't allocate memory")


def clear_device_cache(garbage_collection: bool = False) -> None:
    if garbage_collection:
        gc.collect()
    runtime = _runtime.current()
    if runtime is not None and runtime.device.type != "cpu":
        runtime.device_kind.empty_cache()


def release_memory(*objects: Any) -> list[None]:
    """Drop references and empty the device cache: `a, b = release_memory(a, b)`."""
    objects_list = list(objects)
    for i in range(len(objects_list)):
        objects_list[i] = None
    clear_device_cache(garbage_collection=True)
    return [None] * len(objects)


def should_reduce_batch_size(exception: BaseException) -> bool:
    return isinstance(exception, (RuntimeError, MemoryError)) and any(
        marker in str(exception).lower() for marker in _OOM_MARKERS
    )


def find_executable_batch_size(
    function: Callable | None = None,
    starting_batch_size: int = 128,
    reduce_batch_size_fn: Callable[[], int] | None = None,
) -> Callable:
    """Call `function(batch_size, ...)`, shrinking the batch size to 90 % after each out-of-memory error.

    As in Accelerate, the size found is kept: calling the decorated function again starts from it.
    `reduce_batch_size_fn()` (no arguments) may return the next size instead.
    """
    if function is None:
        return functools.partial(
            find_executable_batch_size,
            starting_batch_size=starting_batch_size,
            reduce_batch_size_fn=reduce_batch_size_fn,
        )
    batch_size = starting_batch_size

    def shrink() -> int:
        return int(batch_size * 0.9)

    reduce = reduce_batch_size_fn or shrink

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        nonlocal batch_size
        params = list(inspect.signature(function).parameters)
        if len(params) < len(args) + 1:
            raise TypeError(
                f"Batch size was passed into `{function.__name__}` as the first argument when called: "
                f"remove it, find_executable_batch_size passes it (got {len(args)} positional arguments)"
            )
        clear_device_cache(garbage_collection=True)
        while True:
            if batch_size == 0:
                raise RuntimeError("No executable batch size found, reached zero.")
            try:
                return function(batch_size, *args, **kwargs)
            except Exception as err:
                if not should_reduce_batch_size(err):
                    raise
                clear_device_cache(garbage_collection=True)
                batch_size = reduce()

    return wrapper
