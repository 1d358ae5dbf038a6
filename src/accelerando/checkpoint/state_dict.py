"""Reading and writing model / optimizer state: full state dicts as files, sharded ones through DCP.

Full state dicts (single device, DDP): weights as safetensors (shared tensors stored once, their
other names kept as aliases in the file's metadata), everything else `torch.save` + weights-only load.
Sharded state dicts (FSDP2's SHARDED_STATE_DICT, see `strategies/state_io.py`): every rank writes
its shards with `torch.distributed.checkpoint` into the same staging directory, so the atomic rename
and the manifest cover them like any other file.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from accelerando.checkpoint.diskspace import reporting_space, serialized_size

ALIASES_KEY = "accelerando_aliases"


# ---- shared tensors -----------------------------------------------------------------------------
def _storage_key(t: torch.Tensor) -> tuple[Any, ...]:
    from huggingface_hub import get_torch_storage_id

    return (t.device.type, get_torch_storage_id(t))


def dedupe_shared(
    state_dict: dict[str, torch.Tensor], drop_first: Iterable[str] = ()
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Keep one name per shared tensor; return (deduplicated dict, {dropped name: kept name}).

    `drop_first` names (e.g. transformers' tied targets such as `lm_head.weight`) are dropped in
    preference, so the kept name is the one `from_pretrained` expects. Overlapping views that are
    not the same tensor are cloned: safetensors cannot store them otherwise.
    """
    prefer_drop = set(drop_first)
    position = {name: i for i, name in enumerate(state_dict)}
    groups: dict[tuple[Any, ...], list[str]] = {}
    for name, tensor in state_dict.items():
        if isinstance(tensor, torch.Tensor) and tensor.device.type != "meta":
            groups.setdefault(_storage_key(tensor), []).append(name)
    out = dict(state_dict)
    aliases: dict[str, str] = {}
    for names in groups.values():
        if len(names) < 2:
            continue
        ordered = sorted(names, key=lambda n: (n in prefer_drop, position[n]))  # else the first registered
        keep = out[ordered[0]]
        for name in ordered[1:]:
            t = out[name]
            same = t.data_ptr() == keep.data_ptr() and t.shape == keep.shape and t.stride() == keep.stride()
            if same:
                aliases[name] = ordered[0]
                del out[name]
            else:
                out[name] = t.clone()
    return out, aliases


def restore_aliases(state_dict: dict[str, torch.Tensor], aliases: dict[str, str]) -> dict[str, torch.Tensor]:
    for dropped, kept in aliases.items():
        if dropped not in state_dict and kept in state_dict:
            state_dict[dropped] = state_dict[kept]
    return state_dict


def tied_targets(model: torch.nn.Module) -> set[str]:
    """Names transformers re-ties itself (`_tied_weights_keys`), to drop rather than keep."""
    keys = getattr(model, "_tied_weights_keys", None) or {}
    return set(keys) if isinstance(keys, (dict, list, tuple, set)) else set()


# ---- full state dict files ------------------------------------------------------------------------
_ST_DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2",
}  # fmt: skip


def write_safetensors(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    """A standard safetensors file, written straight from the tensors' memory (no staging buffer).

    Falls back to `safetensors.torch.save_file` for dtypes this writer does not know.
    """
    if any(t.dtype not in _ST_DTYPES for t in tensors.values()):
        from safetensors.torch import save_file

        save_file(tensors, str(path), metadata=metadata)
        return
    header: dict[str, Any] = {"__metadata__": metadata}
    offset = 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        header[name] = {
            "dtype": _ST_DTYPES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with reporting_space(path, lambda: 8 + len(raw) + offset), open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for t in tensors.values():
            if t.numel():
                f.write(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().data)


def write_model_file(
    path: Path, state_dict: dict[str, Any], safe: bool, drop_first: Iterable[str] = ()
) -> None:
    """One model's weights: safetensors when `safe`, else `torch.save` (loaded weights-only)."""
    if not safe:
        save_torch_file(path, state_dict)
        return
    tensors = {k: v.detach().contiguous() for k, v in state_dict.items()}
    tensors, aliases = dedupe_shared(tensors, drop_first)
    metadata = {"format": "pt"}
    if aliases:
        metadata[ALIASES_KEY] = json.dumps(aliases)
    write_safetensors(path, tensors, metadata)


def read_model_file(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".safetensors":
        from safetensors import safe_open
        from safetensors.torch import load_file

        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
        state = load_file(str(path), device="cpu")
        return restore_aliases(state, json.loads(metadata.get(ALIASES_KEY, "{}")))
    return load_data_file(path)


def write_data_file(path: Path, obj: Any) -> None:
    """`torch.save` without the zip's own CRC-32: the manifest checksums every file already, and
    torch's CRC runs at ~0.3 GB/s here, which made it the bottleneck of saving optimizer state."""
    try:
        from torch.utils.serialization import config
    except ImportError:  # older torch: no switch, save as usual
        save_torch_file(path, obj)
        return
    previous = config.save.compute_crc32
    config.save.compute_crc32 = False
    try:
        save_torch_file(path, obj)
    finally:
        config.save.compute_crc32 = previous


def save_torch_file(path: Path, obj: Any) -> None:
    """`torch.save` through a Python file object: as fast as a path, and a failed write keeps its
    OSError (a path goes through C++ streams, which report only "unexpected pos")."""
    with reporting_space(path, lambda: serialized_size(obj)), open(path, "wb") as f:
        torch.save(obj, f)


def load_data_file(path: Path) -> Any:
    """Everything but weights: `torch.load(weights_only=True)`, so no pickled code runs."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - report which file and why, whatever torch raised
        from accelerando.checkpoint.atomic import CheckpointError

        raise CheckpointError(
            f"{path.name} cannot be loaded weights-only ({type(err).__name__}: {str(err)[:300]}); "
            "state_dict() of registered objects must return tensors and plain Python data"
        ) from err


def is_extra_state(key: str) -> bool:
    """A module's `get_extra_state()` entry (torch's `_extra_state` key): opaque to us, and its size
    is not the model's to check (Transformer Engine's fp8 scaling state is empty until the first fp8
    forward, then a pickled blob whose length varies)."""
    return key.rpartition(".")[2] == "_extra_state"


def check_model_state(
    expected: dict[str, Any], loaded: dict[str, Any], name: str, strict: bool = True
) -> list[str]:
    """Problems that would make `load_state_dict` fail half-way: keys and shapes, checked up front."""
    problems = []
    missing = sorted(set(expected) - set(loaded))
    unexpected = sorted(set(loaded) - set(expected))
    if strict and missing:
        problems.append(f"{name} lacks keys {missing[:8]}{' ...' if len(missing) > 8 else ''}")
    if strict and unexpected:
        problems.append(f"{name} has unexpected keys {unexpected[:8]}{' ...' if len(unexpected) > 8 else ''}")
    for key in sorted(set(expected) & set(loaded)):
        want, got = expected[key], loaded[key]
        if is_extra_state(key):
            continue
        if isinstance(want, torch.Tensor) and isinstance(got, torch.Tensor) and want.shape != got.shape:
            problems.append(
                f"{name}[{key!r}] has shape {tuple(got.shape)}, the model has {tuple(want.shape)}"
            )
    return problems


def check_optimizer_state(optimizer: torch.optim.Optimizer, loaded: Any, name: str) -> list[str]:
    """The saved optimizer must have the same parameter groups as the live one."""
    if not isinstance(loaded, dict) or "param_groups" not in loaded or "state" not in loaded:
        return [f"{name} is not an optimizer state dict"]
    live = [len(g["params"]) for g in optimizer.param_groups]
    saved = [len(g.get("params", [])) for g in loaded["param_groups"]]
    if live != saved:
        return [f"{name} has parameter groups of sizes {saved}, the optimizer has {live}"]
    return []


# ---- sharded (DCP) --------------------------------------------------------------------------------
def save_sharded(directory: Path, state: dict[str, Any]) -> None:
    """Every rank writes its shards of `state` (DTensors) into `directory` (collective)."""
    import torch.distributed.checkpoint as dcp

    dcp.save(state, checkpoint_id=str(directory))


def load_sharded(directory: Path, template: dict[str, Any]) -> dict[str, Any]:
    """Fill a copy of `template` (this rank's shards) from `directory` (collective).

    The copy keeps the live tensors untouched until the strategy applies the result.
    """
    import torch.distributed.checkpoint as dcp

    target = _clone_tree(template)
    dcp.load(target, checkpoint_id=str(directory))
    return target


def _clone_tree(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: _clone_tree(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clone_tree(v) for v in obj]
    return obj
