"""`save_model`, `get_state_dict` and `save`: exporting weights for other tools (transformers, the Hub).

Weights are split with `huggingface_hub.split_torch_state_dict_into_shards` and written as
safetensors shards plus `model.safetensors.index.json`; tensors shared between names (tied
embeddings) are stored once. Every file is written under a temporary name, flushed and renamed, and
the index is renamed last, so a reader never sees a truncated file.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from accelerando.checkpoint import atomic
from accelerando.checkpoint import state_dict as sd_io
from accelerando.utils.constants import (
    SAFE_WEIGHTS_INDEX_NAME,
    SAFE_WEIGHTS_PATTERN_NAME,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_PATTERN_NAME,
)

if TYPE_CHECKING:
    from accelerando.strategies.base import Strategy

_STAGING = ".accelerando-save-model.incomplete"


def get_state_dict(strategy: Strategy, model: torch.nn.Module, unwrap: bool = True) -> dict[str, Any]:
    """The full state dict (collective for sharding strategies; only rank 0 then holds it all)."""
    if not unwrap:
        return model.state_dict()
    inner = strategy.unwrap(model)
    if any(p.device.type == "meta" for p in inner.parameters()):  # offloaded by big-model hooks
        from accelerando.utils.modeling import get_state_dict_offloaded_model

        return get_state_dict_offloaded_model(inner)
    return strategy.model_state_dict(model, full=True)


def without_extra_state(state: dict[str, Any]) -> dict[str, Any]:
    """Exported weights are what the plain model loads: modules' `_extra_state` entries (Transformer
    Engine's fp8 scaling state) stay in `save_state` checkpoints only."""
    return {k: v for k, v in state.items() if not sd_io.is_extra_state(k)}


def _shard_pattern(safe: bool) -> tuple[str, str]:
    return (
        (SAFE_WEIGHTS_PATTERN_NAME, SAFE_WEIGHTS_INDEX_NAME)
        if safe
        else (WEIGHTS_PATTERN_NAME, WEIGHTS_INDEX_NAME)
    )


def _is_weights_file(name: str, safe: bool) -> bool:
    """Files a previous `save_model` may have left: `model.safetensors`, `model-00001-of-00002.safetensors`."""
    stem = "model" if safe else "pytorch_model"
    ext = r"\.safetensors" if safe else r"\.bin"
    return re.fullmatch(rf"{stem}(-\d{{5}}-of-\d{{5}})?{ext}", name) is not None


def save_model(
    strategy: Strategy,
    model: torch.nn.Module,
    save_directory: str | os.PathLike[str],
    max_shard_size: int | str = "10GB",
    safe_serialization: bool = True,
) -> None:
    """Write `model`'s weights into `save_directory` (main process; every rank must call it)."""
    directory = Path(save_directory)
    if directory.is_file():
        raise ValueError(f"save_directory {str(directory)!r} is a file; save_model needs a directory")
    state = without_extra_state(get_state_dict(strategy, model))
    if strategy.ctx.rank == 0:
        unwrapped = strategy.unwrap(model)
        write_sharded_weights(
            directory, state, max_shard_size, safe_serialization, sd_io.tied_targets(unwrapped)
        )
    atomic.barrier()


def write_sharded_weights(
    directory: Path,
    state: dict[str, Any],
    max_shard_size: int | str = "10GB",
    safe_serialization: bool = True,
    drop_first: set[str] | None = None,
) -> list[str]:
    """Shard, write under temporary names, flush, rename; index last; stale shards removed. Returns files."""
    from huggingface_hub import split_torch_state_dict_into_shards

    pattern, index_name = _shard_pattern(safe_serialization)
    tensors = {k: v.detach() for k, v in state.items() if isinstance(v, torch.Tensor)}
    aliases: dict[str, str] = {}
    if safe_serialization:
        tensors = {k: v.contiguous() for k, v in tensors.items()}
        tensors, aliases = sd_io.dedupe_shared(tensors, drop_first or ())
    split = split_torch_state_dict_into_shards(
        tensors, filename_pattern=pattern, max_shard_size=max_shard_size
    )
    directory.mkdir(parents=True, exist_ok=True)
    staging = directory / _STAGING
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir()
    metadata = {"format": "pt", **({sd_io.ALIASES_KEY: json.dumps(aliases)} if aliases else {})}
    try:
        for filename, names in split.filename_to_tensors.items():
            shard = {name: tensors[name] for name in names}
            path = staging / filename
            if safe_serialization:  # our writers keep the OS error of a full disk (OutOfSpaceError)
                sd_io.write_safetensors(path, shard, metadata)
            else:
                sd_io.save_torch_file(path, shard)
            atomic.fsync_path(path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)  # nothing half-written is left behind
        raise
    written = list(split.filename_to_tensors)
    for filename in written:
        os.replace(staging / filename, directory / filename)
    if split.is_sharded:
        index = {
            "metadata": {**split.metadata, **({"aliases": aliases} if aliases else {})},
            "weight_map": split.tensor_to_filename,
        }
        tmp = staging / index_name
        tmp.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
        atomic.fsync_path(tmp)
        os.replace(tmp, directory / index_name)
    elif (directory / index_name).exists():
        (directory / index_name).unlink()
    for entry in directory.iterdir():
        if _is_weights_file(entry.name, safe_serialization) and entry.name not in written:
            entry.unlink()
    shutil.rmtree(staging)
    atomic.fsync_path(directory)
    return written


def save(strategy: Strategy, obj: Any, f: Any, safe_serialization: bool = False) -> None:
    """Save `obj` once (main process), atomically when `f` is a path: a temporary file, flushed, renamed."""
    if strategy.ctx.rank != 0:
        return
    if not isinstance(f, (str, os.PathLike)):
        torch.save(obj, f)
        return
    target = Path(f)
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}"
    try:
        if safe_serialization:
            if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
                raise TypeError(
                    f"save(..., safe_serialization=True) needs a dict of tensors; got {type(obj).__name__}"
                )
            tensors, aliases = sd_io.dedupe_shared({k: v.contiguous() for k, v in obj.items()})
            meta = {"format": "pt", **({sd_io.ALIASES_KEY: json.dumps(aliases)} if aliases else {})}
            sd_io.write_safetensors(tmp, tensors, meta)
        else:
            sd_io.save_torch_file(tmp, obj)
        atomic.fsync_path(tmp)
        os.replace(tmp, target)
        atomic.fsync_path(target.parent if str(target.parent) else Path("."))
    finally:
        if tmp.exists():
            tmp.unlink()
