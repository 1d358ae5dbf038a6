"""A tqdm progress bar shown by the main process only (unless asked otherwise)."""

from __future__ import annotations

from typing import Any

from accelerando import _runtime


def tqdm(*args: Any, main_process_only: bool = True, **kwargs: Any) -> Any:
    """`tqdm.auto.tqdm` that is disabled on every rank but the local main one."""
    from tqdm.auto import tqdm as _tqdm

    if args and isinstance(args[0], bool):
        raise TypeError(
            "tqdm's first positional argument is the iterable; main_process_only is keyword-only since "
            "Accelerate 1.0: tqdm(iterable, main_process_only=True)"
        )
    runtime = _runtime.current()
    if main_process_only and runtime is not None and runtime.topology.local_rank != 0:
        kwargs["disable"] = True
    return _tqdm(*args, **kwargs)
