"""Weights that live on disk and are served on demand, memory-mapped.

Two sources share one index format (``index.json``: name -> entry), compatible with Accelerate's:
  * ``{"dtype", "shape"}``: a ``<name>.dat`` numpy memmap written by `offload_weight`;
  * ``{"safetensors_file", "weight_name", "dtype"}``: a tensor inside an existing safetensors
    checkpoint, served from it directly (nothing is copied or rewritten).
Reads are zero-copy views of the mapping; `prefetch` asks the kernel to read ahead (posix_fadvise)
so the next layer's pages are in the page cache before its forward needs them.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open

_NUMPY_UNSUPPORTED = {torch.bfloat16: torch.int16}
SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}


def _str_to_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.replace("torch.", ""), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"offload index names an unknown dtype {name!r}")
    return dtype


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def offload_weight(
    weight: torch.Tensor, weight_name: str, offload_folder: str | os.PathLike[str], index: dict | None = None
) -> dict:
    """Write `weight` to ``<offload_folder>/<weight_name>.dat`` (atomically) and record it in `index`."""
    folder = Path(offload_folder)
    folder.mkdir(parents=True, exist_ok=True)
    dtype = str(weight.dtype).replace("torch.", "")
    tensor = weight.detach().to("cpu").contiguous()
    if tensor.dtype in _NUMPY_UNSUPPORTED:
        tensor = tensor.view(_NUMPY_UNSUPPORTED[tensor.dtype])
    array = tensor.numpy()
    shape = list(array.shape) or [1]
    final = folder / f"{weight_name}.dat"
    tmp = folder / f".{weight_name}.dat.tmp{os.getpid()}"
    if array.size:
        memmap = np.memmap(tmp, dtype=array.dtype, mode="w+", shape=tuple(shape))
        memmap[:] = array.reshape(shape)
        memmap.flush()
        del memmap
    else:
        tmp.write_bytes(b"")
    os.replace(tmp, final)
    index = {} if index is None else index
    index[weight_name] = {"dtype": dtype, "shape": list(weight.shape)}
    return index


def load_offloaded_weight(
    weight_file: str | os.PathLike[str], weight_info: Mapping[str, Any]
) -> torch.Tensor:
    """Memory-map one ``.dat`` file as a tensor (zero-copy; copy-on-write so it can be modified)."""
    dtype = _str_to_dtype(weight_info["dtype"])
    shape = tuple(weight_info["shape"])
    stored = _NUMPY_UNSUPPORTED.get(dtype, dtype)
    if int(np.prod(shape)) == 0:
        return torch.empty(shape, dtype=dtype)
    np_dtype = torch.empty((), dtype=stored).numpy().dtype
    array = np.memmap(weight_file, dtype=np_dtype, mode="c", shape=shape or (1,))
    tensor = torch.from_numpy(array)
    if not shape:
        tensor = tensor[0]
    return tensor.view(dtype) if stored != dtype else tensor


def save_offload_index(index: Mapping[str, Any], offload_folder: str | os.PathLike[str]) -> None:
    """Merge `index` into ``<offload_folder>/index.json`` (atomic rewrite)."""
    if not index:
        return
    folder = Path(offload_folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "index.json"
    current = json.loads(path.read_text()) if path.exists() else {}
    current.update(index)
    _atomic_write_text(path, json.dumps(current, indent=2))


def offload_state_dict(save_dir: str | os.PathLike[str], state_dict: Mapping[str, torch.Tensor]) -> None:
    """Write every tensor of `state_dict` to `save_dir` plus its index."""
    index: dict = {}
    for name, tensor in state_dict.items():
        offload_weight(tensor, name, save_dir, index=index)
    save_offload_index(index, save_dir)


def load_offloaded_weights(model: torch.nn.Module, index: Mapping[str, Any], offload_folder: str) -> None:
    """Copy offloaded weights back into `model` (on cpu), e.g. after a temporary offload."""
    from accelerando.big_model.tensors import set_module_tensor_to_device

    loader = OffloadedWeightsLoader(save_folder=offload_folder, index=dict(index))
    for name in index:
        set_module_tensor_to_device(model, name, "cpu", value=loader[name].clone())


class OffloadedWeightsLoader(Mapping[str, torch.Tensor]):
    """Name -> tensor over an in-memory state dict plus an offload index (read lazily, mmap)."""

    def __init__(
        self,
        state_dict: Mapping[str, torch.Tensor] | None = None,
        save_folder: str | os.PathLike[str] | None = None,
        index: Mapping[str, Any] | None = None,
        device: torch.device | str | int | None = None,
    ) -> None:
        if state_dict is None and save_folder is None and index is None:
            raise ValueError("OffloadedWeightsLoader needs a state_dict, a save_folder or an index")
        self.state_dict = dict(state_dict or {})
        self.save_folder = None if save_folder is None else Path(save_folder)
        if index is None and self.save_folder is not None and (self.save_folder / "index.json").exists():
            index = json.loads((self.save_folder / "index.json").read_text())
        self.index: dict[str, Any] = dict(index or {})
        self.device = device
        self.all_keys = list(self.state_dict) + [k for k in self.index if k not in self.state_dict]
        self._files: dict[str, Any] = {}
        self._views: dict[str, torch.Tensor] = {}

    def __getitem__(self, key: str) -> torch.Tensor:
        if key in self.state_dict:
            return self.state_dict[key]
        info = self.index[key]
        tensor = self._view(key, info)
        if "dtype" in info and tensor.is_floating_point():
            tensor = tensor.to(_str_to_dtype(info["dtype"]))
        return tensor if self.device is None else tensor.to(self.device)

    def _view(self, key: str, info: Mapping[str, Any]) -> torch.Tensor:
        """The tensor as a view of its file mapping, kept: dropping it would unmap the pages and make
        every later forward fault them in again (they stay reclaimable page cache, not process memory)."""
        view = self._views.get(key)
        if view is not None:
            return view
        if "safetensors_file" in info:
            view = self._handle(info["safetensors_file"]).get_tensor(info.get("weight_name", key))
        elif self.save_folder is None:
            raise ValueError(f"{key!r} is offloaded to a .dat file but the loader has no save_folder")
        else:
            view = load_offloaded_weight(self.save_folder / f"{key}.dat", info)
        self._views[key] = view
        return view

    def _handle(self, file: str) -> Any:
        handle = self._files.get(file)
        if handle is None:
            handle = self._files[file] = safe_open(file, framework="pt", device="cpu")
        return handle

    def __iter__(self) -> Iterator[str]:
        return iter(self.all_keys)

    def __len__(self) -> int:
        return len(self.all_keys)

    def prefetch(self, keys: Iterable[str]) -> None:
        """Ask the kernel to start reading these tensors' bytes (non-blocking; a hint).

        One call per file, over the range covering the tensors (a block's tensors sit together).
        """
        ranges: dict[str, tuple[int, int]] = {}
        for key in keys:
            info = self.index.get(key)
            if info is None or key in self.state_dict:
                continue
            if "safetensors_file" in info:
                file = info["safetensors_file"]
                start, length = _safetensors_span(file, info.get("weight_name", key))
            elif self.save_folder is not None:
                file, start, length = str(self.save_folder / f"{key}.dat"), 0, 0
            else:
                continue
            low, high = ranges.get(file, (start, start + length))
            ranges[file] = (min(low, start), max(high, start + length))
        for file, (low, high) in ranges.items():
            _advise(file, low, high - low)


_SPANS: dict[str, dict[str, tuple[int, int]]] = {}


def safetensors_spans(file: str) -> dict[str, tuple[int, int]]:
    """name -> (byte offset, length) of every tensor in a safetensors file, read from its JSON header."""
    with open(file, "rb") as fh:
        (header_len,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(header_len))
    base = 8 + header_len
    return {
        k: (base + v["data_offsets"][0], v["data_offsets"][1] - v["data_offsets"][0])
        for k, v in header.items()
        if k != "__metadata__"
    }


def _safetensors_span(file: str, name: str) -> tuple[int, int]:
    """One tensor's span, cached per file (used for read-ahead hints only, where stale is harmless)."""
    spans = _SPANS.get(file)
    if spans is None or name not in spans:
        spans = _SPANS[file] = safetensors_spans(file)
    return spans[name]


def _advise(file: str, offset: int, length: int) -> None:
    if not hasattr(os, "posix_fadvise"):
        return
    try:
        fd = os.open(file, os.O_RDONLY)
    except OSError:
        return
    try:
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_WILLNEED)
    finally:
        os.close(fd)


class PrefixedDataset(Mapping[str, torch.Tensor]):
    """A view of `dataset` restricted to keys under `prefix`, with the prefix removed."""

    def __init__(self, dataset: Mapping[str, torch.Tensor], prefix: str) -> None:
        self.dataset = dataset
        self.prefix = prefix

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.dataset[f"{self.prefix}{key}"]

    def __iter__(self) -> Iterator[str]:
        return iter([k[len(self.prefix) :] for k in self.dataset if k.startswith(self.prefix)])

    def __len__(self) -> int:
        return sum(1 for k in self.dataset if k.startswith(self.prefix))

    def prefetch(self, keys: Iterable[str]) -> None:
        inner = getattr(self.dataset, "prefetch", None)
        if inner is not None:
            inner([f"{self.prefix}{k}" for k in keys])


class AliasedWeights(Mapping[str, torch.Tensor]):
    """`base` plus extra names that read another key (tied weights saved once in a checkpoint)."""

    def __init__(self, base: Mapping[str, torch.Tensor], aliases: Mapping[str, str]) -> None:
        self.base = base
        self.aliases = dict(aliases)

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.base[self.aliases.get(key, key)]

    def __iter__(self) -> Iterator[str]:
        yield from self.base
        yield from (k for k in self.aliases if k not in self.base)

    def __len__(self) -> int:
        return len(self.base) + sum(1 for k in self.aliases if k not in self.base)

    def prefetch(self, keys: Iterable[str]) -> None:
        inner = getattr(self.base, "prefetch", None)
        if inner is not None:
            inner([self.aliases.get(k, k) for k in keys])


def extract_submodules_state_dict(
    state_dict: Mapping[str, torch.Tensor], submodule_names: Iterable[str]
) -> dict[str, torch.Tensor]:
    """The entries of `state_dict` that belong to any of `submodule_names`."""
    names = list(submodule_names)
    return {
        key: value
        for key, value in state_dict.items()
        if any(name == "" or key == name or key.startswith(name + ".") for name in names)
    }
