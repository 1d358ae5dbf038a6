"""Accelerate's `accelerate.checkpointing` names, over `accelerando.checkpoint`.

`save_custom_state` / `load_custom_state` keep Accelerate's signatures; the rest is accelerando's
own checkpoint toolkit (validation, automatic names) for scripts that inspect checkpoints.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from accelerando.checkpoint.atomic import (
    MANIFEST_NAME,
    CheckpointError,
    Manifest,
    is_complete,
    read_manifest,
    validate_checkpoint,
)
from accelerando.checkpoint.layout import Layout
from accelerando.checkpoint.manager import Checkpointer
from accelerando.checkpoint.model_io import get_state_dict, save_model, write_sharded_weights
from accelerando.checkpoint.naming import latest_checkpoint, list_checkpoints
from accelerando.checkpoint.state_dict import load_data_file, write_data_file


def save_custom_state(
    obj: Any, path: str | os.PathLike[str], index: int = 0, save_on_each_node: bool = False
) -> None:
    """Write `obj.state_dict()` as `custom_checkpoint_{index}.pkl` in `path` (weights-only loadable)."""
    write_data_file(Path(path) / Layout().custom(index), obj.state_dict())


def load_custom_state(obj: Any, path: str | os.PathLike[str], index: int = 0) -> None:
    """Inverse of `save_custom_state`; never unpickles code."""
    obj.load_state_dict(load_data_file(Path(path) / Layout().custom(index)))


__all__ = [
    "MANIFEST_NAME",
    "CheckpointError",
    "Checkpointer",
    "Manifest",
    "get_state_dict",
    "is_complete",
    "latest_checkpoint",
    "list_checkpoints",
    "load_custom_state",
    "read_manifest",
    "save_custom_state",
    "save_model",
    "validate_checkpoint",
    "write_sharded_weights",
]
