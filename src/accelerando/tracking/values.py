"""Make a run's configuration and logged values something every SDK accepts.

Configs hold dtypes, paths, enums, devices and dataclasses; SDKs serialise with YAML, JSON or
protobuf and crash on them (Accelerate's `init_trackers` passes them through). `plain` turns any
config into nested dicts/lists of JSON types; `flatten` gives the one-level `a/b` keys that
TensorBoard's hparams and MLflow's params need.
"""

from __future__ import annotations

import dataclasses
import enum
import os
from collections.abc import Mapping
from typing import Any

import torch

_SCALARS = (bool, int, float, str, type(None))


def plain(value: Any) -> Any:
    """`value` as None/bool/int/float/str, lists and str-keyed dicts of them; anything else by str()."""
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, enum.Enum):
        return plain(value.value)
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((plain(v) for v in value), key=repr)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    item = _single_number(value)
    if item is not None:
        return item
    return str(value)


def _single_number(value: Any) -> int | float | bool | None:
    """A one-element tensor or a numpy scalar/array as a Python number; None for anything else."""
    numel = getattr(value, "numel", None) if isinstance(value, torch.Tensor) else getattr(value, "size", None)
    size = numel() if callable(numel) else numel
    if size == 1 and hasattr(value, "item"):
        item = value.item()
        if isinstance(item, (bool, int, float)):
            return item
    return None


def flatten(config: Mapping[str, Any], sep: str = "/") -> dict[str, Any]:
    """`{"a": {"b": 1}}` -> `{"a/b": 1}` (after `plain`); lists and None become their text."""
    out: dict[str, Any] = {}

    def visit(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping) and value:
            for k, v in value.items():
                visit(f"{prefix}{sep}{k}" if prefix else str(k), v)
        elif isinstance(value, (bool, int, float, str)):
            out[prefix] = value
        else:
            out[prefix] = str(value)

    for key, value in plain(config).items():
        visit(key, value)
    return out


def log_values(values: Any) -> dict[str, Any]:
    """Check `log`'s values and turn one-element tensors and numpy scalars into Python numbers.

    Other values (text, images, tables, dicts for grouped scalars) are passed as they are: what each
    SDK accepts beyond numbers is its own business.
    """
    if not isinstance(values, Mapping):
        raise TypeError(f"log() takes a dict of name -> value, got {type(values).__name__}")
    out: dict[str, Any] = {}
    for key, value in values.items():
        if not isinstance(key, str):
            raise TypeError(f"log() keys must be strings, got {key!r} ({type(key).__name__})")
        if not isinstance(value, _SCALARS):
            number = _single_number(value)
            value = value if number is None else number
        out[key] = value
    return out
