"""Accelerate's `utils.environment` names. Variables are read and written through `config.env`."""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

from accelerando.config import env
from accelerando.config.env import clear_environment, patch_environment
from accelerando.utils.other import check_os_kernel

logger = logging.getLogger(__name__)

# What a launcher refuses in a variable written to a file or a command line (`KEY=VALUE` lines).
_FORBIDDEN_CHARACTERS = (";", "\n", "<", ">", " ")
# `purge_accelerate_environment` restores these variables: ours and their Accelerate aliases.
_PURGED_PREFIXES = (env.PREFIX, env.ALIAS_PREFIX)
_PURGED_MARK = "_accelerate_is_purged_environment_wrapped"

T = TypeVar("T")


def parse_flag_from_env(key: str, default: bool = False) -> bool:
    """Whether variable `key` holds a true spelling (1, true, yes, ...); `default` when unset."""
    value = env.raw(key)
    return default if value is None else env.parse_bool(value, key)


def convert_dict_to_env_variables(current_env: Mapping[str, str]) -> list[str]:
    """`KEY=VALUE\\n` lines for the safe entries; entries that are empty or hold `; < > space newline`
    are skipped with a warning."""
    lines = []
    for key, value in current_env.items():
        if key and value and not any(c in key + value for c in _FORBIDDEN_CHARACTERS):
            lines.append(f"{key}={value}\n")
        else:
            logger.warning(
                f"WARNING: Skipping {key}={value} as it contains forbidden characters or missing values."
            )
    return lines


def str_to_bool(value: str, to_bool: bool = False) -> int | bool:
    """1/0 (or True/False with `to_bool`) for the spellings `config.env` accepts; ValueError otherwise."""
    result = env.parse_bool(value, "value")
    return result if to_bool else int(result)


@contextlib.contextmanager
def _restored_accelerate_variables() -> Iterator[None]:
    before = {k: v for k, v in env.snapshot().items() if k.startswith(_PURGED_PREFIXES)}
    try:
        yield
    finally:
        added = [k for k in env.snapshot() if k.startswith(_PURGED_PREFIXES) and k not in before]
        env.unset(added)
        env.export(before)


def _purging(function: Callable[..., T]) -> Callable[..., T]:
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        with _restored_accelerate_variables():
            return function(*args, **kwargs)

    setattr(wrapper, _PURGED_MARK, True)
    return wrapper


def _purge_test_methods(cls: type) -> type:
    for name in dir(cls):
        method = getattr(cls, name)
        if name.startswith("test") and callable(method) and not hasattr(method, _PURGED_MARK):
            setattr(cls, name, _purging(method))
    return cls


def purge_accelerate_environment(func_or_cls: Any) -> Any:
    """Decorator: the `ACCELERANDO_*`/`ACCELERATE_*` variables a function (or every `test*` method of
    a class and of its subclasses) sets are removed, and those it changed restored, when it returns.

    For tests: `TrainingArguments(fp16=True)` exports `ACCELERATE_MIXED_PRECISION=fp16`, which would
    otherwise reach the next test's `Accelerator`.
    """
    if not isinstance(func_or_cls, type):
        return _purging(func_or_cls)
    _purge_test_methods(func_or_cls)
    previous = func_or_cls.__dict__.get("__init_subclass__")

    def init_subclass(cls: type, **kwargs: Any) -> None:
        if previous is not None:
            previous.__get__(None, cls)(**kwargs)
        else:
            super(func_or_cls, cls).__init_subclass__(**kwargs)  # type: ignore[misc, arg-type]
        _purge_test_methods(cls)

    func_or_cls.__init_subclass__ = classmethod(init_subclass)  # type: ignore[assignment]
    return func_or_cls


__all__ = [
    "check_os_kernel",
    "clear_environment",
    "convert_dict_to_env_variables",
    "patch_environment",
    "purge_accelerate_environment",
    "str_to_bool",
]


def get_int_from_env(env_keys: list[str], default: int) -> int:
    """The first of `env_keys` set to an integer >= 0, else `default` (WORLD_SIZE, LOCAL_RANK, ...)."""
    for key in env_keys:
        value = env.raw(key)
        if value is not None and int(value) >= 0:
            return int(value)
    return default


def parse_choice_from_env(key: str, default: str = "no") -> str:
    """The raw value of `key`, `default` when unset (choices such as ACCELERATE_MIXED_PRECISION)."""
    value = env.raw(key)
    return str(default) if value is None else value


def are_libraries_initialized(*library_names: str) -> list[str]:
    """Those of `library_names` already imported in this process (a launcher checks before forking)."""
    import sys

    return [name for name in library_names if name in sys.modules]
