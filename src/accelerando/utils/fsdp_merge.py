"""Merge a sharded FSDP checkpoint into full safetensors weights, in one plain process.

Reads the `torch.distributed.checkpoint` shards that `save_state` wrote with SHARDED_STATE_DICT
(no process group, no GPU) and writes the full weights the way `save_model` does:
`model.safetensors`, or `model-0000i-of-0000n.safetensors` plus an index past `max_shard_size`.
It needs host memory for the full model once. `accelerando merge-weights` is its command line.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from accelerando.utils.constants import FSDP_MODEL_NAME

__all__ = ["find_sharded_model", "load_sharded_state_dict", "merge_fsdp_weights"]


def find_sharded_model(checkpoint_dir: str | Path) -> Path:
    """The DCP folder to merge: the folder itself, or the single `pytorch_model_fsdp_N` inside it."""
    root = Path(checkpoint_dir)
    if not root.is_dir():
        raise ValueError(f"checkpoint_directory {str(root)!r} is not a folder")
    if (root / ".metadata").is_file():
        return root
    candidates = sorted(p for p in root.glob(f"{FSDP_MODEL_NAME}*") if (p / ".metadata").is_file())
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        raise ValueError(
            f"{str(root)!r} holds no sharded model (no .metadata, no {FSDP_MODEL_NAME}_N folder); "
            "was it saved with state_dict_type=SHARDED_STATE_DICT?"
        )
    raise ValueError(f"{str(root)!r} holds several models {[p.name for p in candidates]}; pass one of them")


def load_sharded_state_dict(directory: Path) -> dict[str, Any]:
    """Every tensor of the checkpoint, unsharded, in this process (DCP's no-process-group mode)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    # The empty-template planner is what torch's own dcp_to_torch_save uses: it allocates every
    # tensor from the metadata (the public `dcp.load` skips work for an empty template).
    state: dict[str, Any] = {}
    _load_state_dict(
        state,
        storage_reader=FileSystemReader(str(directory)),
        planner=_EmptyStateDictLoadPlanner(),
        no_dist=True,
    )
    if set(state) == {"model"} or ("model" in state and isinstance(state["model"], dict)):
        state = state["model"]  # save_state nests the weights under "model"
    return state


def merge_fsdp_weights(
    checkpoint_dir: str | Path,
    output_path: str | Path,
    safe_serialization: bool = True,
    remove_checkpoint_dir: bool = False,
    max_shard_size: int | str = "10GB",
) -> list[str]:
    """Merge the shards into full weights under `output_path`; returns the files written."""
    import torch
    from huggingface_hub import save_torch_state_dict

    source = find_sharded_model(checkpoint_dir)
    state = {k: v for k, v in load_sharded_state_dict(source).items() if isinstance(v, torch.Tensor)}
    if not state:
        raise ValueError(f"{str(source)!r} contains no tensors to merge")
    out = Path(output_path)
    out.mkdir(parents=True, exist_ok=True)
    before = set(out.iterdir())
    save_torch_state_dict(state, out, max_shard_size=max_shard_size, safe_serialization=safe_serialization)
    written = sorted(p.name for p in set(out.iterdir()) - before) or sorted(p.name for p in out.iterdir())
    if remove_checkpoint_dir:
        shutil.rmtree(Path(checkpoint_dir))
    return written
