"""Loading checkpoints (single file, sharded index, folder) into a model, device by device.

safetensors tensors are memory-mapped: a weight kept on cpu in its stored dtype is used in place
(zero copy, like `load_state_dict(assign=True)`), and a weight mapped to "disk" is not read at
all: the offload index points at it in the original file. A weight bound for an accelerator goes
through `transfer.DeviceTransfers`: several threads read file bytes into pinned buffers and copy
them to the device asynchronously, into memory reserved in one allocation up front.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn

from accelerando.big_model.device_map import DeviceKey, device_for
from accelerando.big_model.offload import (
    SAFETENSORS_DTYPES,
    load_offloaded_weights,
    offload_weight,
    safetensors_spans,
    save_offload_index,
)
from accelerando.big_model.sizes import (
    _as_dtype,
    find_tied_parameters,
    named_module_tensors,
    retie_parameters,
)
from accelerando.big_model.tensors import as_torch_device, check_shape, set_module_tensor_to_device
from accelerando.big_model.transfer import (
    DeviceTransfers,
    FileSpan,
    HostSource,
    Transfer,
    has_streams,
    raw_reads_supported,
)
from accelerando.checkpoint.confine import confined

logger = logging.getLogger(__name__)

_SINGLE_NAMES = ("pytorch_model.bin", "model.safetensors")  # Accelerate's order: the .bin wins


def resolve_checkpoint_files(checkpoint: str | os.PathLike[str]) -> list[Path]:
    """A checkpoint file, an index JSON, or a folder holding either -> the list of weight files.

    As in Accelerate: any ``*.json`` file is an index (a ``weight_map`` inside, or the map itself); a
    folder's ``pytorch_model.bin`` or ``model.safetensors`` is used whole, else its one
    ``*.index.json`` (of any name). A folder holding just one ``*.safetensors`` file is also accepted.
    """
    path = Path(checkpoint)
    if path.is_dir():
        return resolve_checkpoint_files(_checkpoint_in_folder(path))
    if not path.is_file():
        raise ValueError(
            "`checkpoint` should be the path to a file containing a whole state dict, or the index of a sharded "
            f"checkpoint, or a folder containing a sharded checkpoint or the whole state dict, but got {path}, "
            "which does not exist."
        )
    if path.name.endswith(".json"):
        names = dict.fromkeys(_weight_map(path).values())
        # A shard may resolve where the index itself does (the HF cache links both into `blobs`).
        return [
            confined(path.parent, name, f"index {str(path)!r}", [path.resolve().parent]) for name in names
        ]
    return [path]


def _checkpoint_in_folder(folder: Path) -> Path:
    for name in _SINGLE_NAMES:
        if (folder / name).is_file():
            return folder / name
    indexes = sorted(p for p in folder.iterdir() if p.name.endswith(".index.json"))
    if len(indexes) > 1:
        raise ValueError(
            f"{folder} containing more than one `.index.json` file, delete the irrelevant ones. "
            f"(found {[p.name for p in indexes]})"
        )
    shards = sorted(folder.glob("*.safetensors"))
    if indexes or len(shards) == 1:
        return (indexes or shards)[0]
    raise ValueError(
        f"{folder} is not a folder containing a `.index.json` file or a {_SINGLE_NAMES[0]} or a "
        f"{_SINGLE_NAMES[1]} file (nor exactly one *.safetensors file; found {len(shards)})"
    )


def _weight_map(index_file: Path) -> dict[str, str]:
    """Tensor name -> shard file name, from a sharded-checkpoint index (``weight_map`` optional)."""
    index = json.loads(index_file.read_text())
    weight_map = index.get("weight_map", index) if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ValueError(
            f"{index_file} is not a sharded-checkpoint index: expected a JSON object mapping tensor names to "
            "shard files, or one with such a mapping under 'weight_map'"
        )
    return weight_map


def load_state_dict(
    checkpoint_file: str | os.PathLike[str], device_map: Mapping[str, DeviceKey] | None = None
) -> dict[str, torch.Tensor]:
    """One weights file as a dict of cpu tensors, memory-mapped (.bin read with weights_only=True)."""
    path = str(checkpoint_file)
    if path.endswith(".safetensors"):
        with safe_open(path, framework="pt", device="cpu") as handle:
            if device_map is None:
                return {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118
            return {k: handle.get_tensor(k) for k in handle.keys() if device_for(k, device_map) != "disk"}  # noqa: SIM118
    return torch.load(path, map_location="cpu", weights_only=True, mmap=True)


@dataclass
class LoadReport:
    """What loading did: tensors served from disk (the offload index), and what did not match."""

    offload_index: dict[str, Any] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)


def _load_dtype(
    name: str,
    stored: torch.dtype,
    dtype: torch.dtype | None,
    keep_fp32: Sequence[str],
    model_dtype: torch.dtype,
) -> torch.dtype:
    """The dtype a tensor ends up in: `dtype` for floats (fp32 for keep_in_fp32 modules), else stored."""
    if not stored.is_floating_point:
        return stored
    if any(part in name.split(".") or name.startswith(part + ".") for part in keep_fp32):
        return torch.float32
    if dtype is not None:
        return dtype
    return model_dtype if model_dtype.is_floating_point else stored


class _Loader:
    """One pass over the checkpoint files putting each tensor where the device map says."""

    def __init__(
        self,
        model: nn.Module,
        device_map: Mapping[str, DeviceKey] | None,
        dtype: torch.dtype | None,
        offload_folder: str | None,
        offload_buffers: bool,
        keep_in_fp32_modules: Sequence[str],
        staging: str | None,
    ) -> None:
        self.model = model
        self.device_map = device_map
        self.dtype = dtype
        self.offload_folder = offload_folder
        self.offload_buffers = offload_buffers
        self.keep_fp32 = list(keep_in_fp32_modules)
        self.staging = staging
        self.staged: dict[str, Any] = {}
        self.expected = dict(named_module_tensors(model, recurse=True))
        self.alias_of = _tie_aliases(model, self.expected)
        self.slots = {
            (f"{prefix}.{attr}" if prefix else attr): (module, attr)
            for prefix, module in model.named_modules()
            for attr in module._parameters
        }
        self.single = None if device_map is None or set(device_map) != {""} else device_map[""]
        self.report = LoadReport()
        self.loaded: set[str] = set()
        self.transfers = DeviceTransfers()
        self.in_flight: list[tuple[str, torch.dtype]] = []
        self.spans: dict[str, dict[str, tuple[int, int]]] = {}

    def target(self, name: str) -> DeviceKey:
        if self.single is not None:
            return self.single
        if self.device_map is None:
            current = self.expected[name].device
            return "cpu" if current.type == "meta" else str(current)
        return device_for(name, self.device_map)

    def reserve_device_memory(self) -> None:
        """Tell each accelerator how many bytes are coming, so it can set them aside in one go."""
        totals: dict[torch.device, int] = {}
        for name, tensor in self.expected.items():
            try:
                device = _streamed_device(self.target(name))
            except ValueError:  # not in the map: only an error if the checkpoint holds it
                continue
            if device is not None:
                dtype = _load_dtype(name, tensor.dtype, self.dtype, self.keep_fp32, tensor.dtype)
                totals[device] = totals.get(device, 0) + tensor.numel() * dtype.itemsize
        self.transfers.reserve(totals)

    def load_file(self, path: Path) -> None:
        if path.suffix == ".safetensors":
            with safe_open(str(path), framework="pt", device="cpu") as handle:
                for key in handle.keys():  # noqa: SIM118
                    name = self._accept(key)
                    if name is not None:
                        self._place_safetensors(path, handle, key, name)
            return
        state = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
        for key, value in state.items():
            name = self._accept(key)
            if name is not None:
                self._place(name, value)

    def _accept(self, key: str) -> str | None:
        """The model tensor a checkpoint key fills, or None (unknown key, or a tie already filled).

        A tied weight has one tensor under several names; a checkpoint may hold it under any of
        them, so every name is accepted and fills the one tensor (once).
        """
        name = self.alias_of.get(key, key)
        if name not in self.expected:
            self.report.unexpected.append(key)
            return None
        return None if key != name and name in self.loaded else name

    def _final_dtype(self, key: str, stored: torch.dtype) -> torch.dtype:
        return _load_dtype(key, stored, self.dtype, self.keep_fp32, self.expected[key].dtype)

    def _place_safetensors(self, path: Path, handle: Any, key: str, name: str) -> None:
        """Put file tensor `key` into model tensor `name` (they differ for a tie's other names)."""
        if self.target(name) == "disk" and self._offloadable(name):
            stored = handle.get_slice(key).get_dtype()
            stored_dtype = SAFETENSORS_DTYPES.get(stored, torch.float32)
            final = self._final_dtype(name, stored_dtype)
            self.report.offload_index[name] = {
                "safetensors_file": str(path.resolve()),
                "weight_name": key,
                "dtype": str(final).replace("torch.", ""),
            }
            self._to_meta(name, final)
            return
        device = _streamed_device(self.target(name))
        if device is not None and raw_reads_supported():
            entry = handle.get_slice(key)
            stored = SAFETENSORS_DTYPES.get(entry.get_dtype())
            if stored is not None and stored == self._final_dtype(name, stored):
                span = self._span(str(path), key)
                self._send(name, FileSpan(str(path), *span), tuple(entry.get_shape()), stored, device)
                return
        self._place(name, handle.get_tensor(key))

    def _span(self, path: str, key: str) -> tuple[int, int]:
        """Where `key`'s bytes are in `path` (the header is read once per file and load)."""
        spans = self.spans.get(path)
        if spans is None:
            spans = self.spans[path] = safetensors_spans(path)
        return spans[key]

    def _offloadable(self, key: str) -> bool:
        parent, _, attr = key.rpartition(".")
        module = self.model.get_submodule(parent) if parent else self.model
        return attr in module._parameters or self.offload_buffers or attr not in module._buffers

    def _to_meta(self, key: str, dtype: torch.dtype) -> None:
        meta = torch.empty(self.expected[key].shape, device="meta", dtype=dtype)
        set_module_tensor_to_device(self.model, key, "meta", value=meta, dtype=dtype)
        self.loaded.add(key)

    def _place(self, key: str, value: torch.Tensor) -> None:
        final = self._final_dtype(key, value.dtype)
        device = self.target(key)
        if device == "disk" and self._offloadable(key):
            if self.offload_folder is None:
                raise ValueError(
                    f"{key!r} is mapped to 'disk' and comes from a non-safetensors file: pass offload_folder= "
                    "(a directory where it can be written)"
                )
            offload_weight(value.to(final), key, self.offload_folder, index=self.report.offload_index)
            self._to_meta(key, final)
            return
        if device == "disk":
            device = "cpu"
        if self.staging is not None and device == "cpu":
            offload_weight(value.to(final), key, self.staging, index=self.staged)
            self._to_meta(key, final)
            return
        if device == "cpu" and value.dtype == final and self._assign(key, value):
            return
        streamed = _streamed_device(device)
        if streamed is not None:
            self._send(key, value, tuple(value.shape), final, streamed)
            return
        set_module_tensor_to_device(self.model, key, device, value=value, dtype=final)
        self.loaded.add(key)

    def _send(
        self, key: str, source: HostSource, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
    ) -> None:
        """Queue a weight for the loader threads; it is put in the model by `finish`, in order."""
        check_shape(key, tuple(self.expected[key].shape), shape)
        self.transfers.submit(Transfer(source, shape, dtype, device))
        self.in_flight.append((key, dtype))

    def _assign(self, key: str, value: torch.Tensor) -> bool:
        """Fast path: a cpu parameter in its stored dtype is used as is (zero copy), like assign=True."""
        slot = self.slots.get(key)
        if slot is None:
            return False
        module, attr = slot
        old = module._parameters[attr]
        if old is None or type(old) is not nn.Parameter or tuple(old.shape) != tuple(value.shape):
            return False
        module._parameters[attr] = nn.Parameter(value, requires_grad=old.requires_grad)
        self.loaded.add(key)
        return True

    def finish(self) -> LoadReport:
        for (key, dtype), value in zip(self.in_flight, self.transfers.results()):
            set_module_tensor_to_device(self.model, key, value.device, value=value, dtype=dtype)
            self.loaded.add(key)
        if self.staging is not None and self.staged:
            load_offloaded_weights(self.model, self.staged, self.staging)
        persistent = {
            n for n, _ in named_module_tensors(self.model, recurse=True, remove_non_persistent=True)
        }
        self.report.missing = sorted(n for n in self.expected if n in persistent and n not in self.loaded)
        return self.report


def load_checkpoint(
    model: nn.Module,
    checkpoint: str | os.PathLike[str],
    device_map: Mapping[str, DeviceKey] | None = None,
    offload_folder: str | os.PathLike[str] | None = None,
    dtype: torch.dtype | str | None = None,
    offload_state_dict: bool = False,
    offload_buffers: bool = False,
    keep_in_fp32_modules: Sequence[str] | None = None,
    strict: bool = False,
) -> LoadReport:
    """Load weights into `model` following `device_map`; returns the report (used by dispatch)."""
    tied = find_tied_parameters(model)
    folder = None if offload_folder is None else str(offload_folder)
    with (
        tempfile.TemporaryDirectory(prefix="accelerando-staging-")
        if offload_state_dict
        else _null() as staging
    ):
        loader = _Loader(
            model, device_map, _as_dtype(dtype), folder, offload_buffers, keep_in_fp32_modules or [], staging
        )
        files = resolve_checkpoint_files(checkpoint)
        try:
            loader.reserve_device_memory()
            for path in files:
                loader.load_file(path)
            report = loader.finish()
        finally:
            loader.transfers.close()
    retie_parameters(model, tied)
    tied_loaded = {n for group in tied if any(m in loader.loaded for m in group) for n in group}
    report.missing = [n for n in report.missing if n not in tied_loaded]
    _alias_tied_offloads(report.offload_index, tied)
    _report_mismatches(report, strict, checkpoint, type(model).__name__)
    return report


def _tie_aliases(model: nn.Module, expected: Mapping[str, torch.Tensor]) -> dict[str, str]:
    """Each extra name of a tied parameter -> the name it is listed under (the one `expected` has)."""
    aliases: dict[str, str] = {}
    for group in find_tied_parameters(model):
        listed = next((n for n in group if n in expected), None)
        if listed is not None:
            aliases.update({n: listed for n in group if n != listed})
    return aliases


def _streamed_device(device: DeviceKey) -> torch.device | None:
    """The accelerator with streams a map value names (its weights go through the loader threads).

    None for the cpu, disk and meta, and for backends without streams (MPS, XLA): those keep the
    plain `.to(device)` in the main thread.
    """
    if device in ("cpu", "disk", "meta") or not isinstance(device, (int, str, torch.device)):
        return None
    resolved = as_torch_device(device)
    return resolved if resolved.type not in ("cpu", "meta") and has_streams(resolved) else None


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _alias_tied_offloads(index: dict[str, Any], tied: list[list[str]]) -> None:
    """A tied weight saved once is served under every name of its group."""
    for group in tied:
        source = next((n for n in group if n in index), None)
        if source is not None:
            for name in group:
                index.setdefault(name, index[source])


def _report_mismatches(
    report: LoadReport, strict: bool, checkpoint: str | os.PathLike[str], model_name: str
) -> None:
    if strict and (report.missing or report.unexpected):
        raise ValueError(
            f"checkpoint does not match the model: missing {report.missing[:10]}, unexpected {report.unexpected[:10]}"
        )
    if report.unexpected:
        logger.warning(
            f"Some weights of the model checkpoint at {checkpoint} were not used when initializing {model_name}: "
            f"{_as_set_text(report.unexpected)}. This may or may not be an issue - make sure that the checkpoint does not have "
            "unnecessary parameters, or that the model definition correctly corresponds to the checkpoint. "
            f"({len(report.unexpected)} tensor(s) skipped: the model has no parameter or buffer of that name.)"
        )
    if report.missing:
        logger.warning(
            "checkpoint lacks %d tensor(s) of the model: %s", len(report.missing), report.missing[:10]
        )


def _as_set_text(names: Sequence[str]) -> str:
    """Names written as Accelerate prints its set of them, in a stable (sorted) order."""
    return "{" + ", ".join(repr(n) for n in sorted(set(names))) + "}"


def load_checkpoint_in_model(
    model: nn.Module,
    checkpoint: str | os.PathLike[str],
    device_map: Mapping[str, DeviceKey] | None = None,
    offload_folder: str | os.PathLike[str] | None = None,
    dtype: torch.dtype | str | None = None,
    offload_state_dict: bool = False,
    offload_buffers: bool = False,
    keep_in_fp32_modules: Sequence[str] | None = None,
    offload_8bit_bnb: bool = False,
    strict: bool = False,
    full_state_dict: bool = True,
    broadcast_from_rank0: bool = False,
) -> None:
    """Accelerate's entry point: load, and write the disk index to `offload_folder` for dispatch.

    Weights mapped to "disk" are needed later by `dispatch_model(offload_dir=offload_folder)`, so
    an `offload_folder` is required when the map has any; safetensors weights are not copied there,
    only referenced from its ``index.json``.
    """
    if offload_8bit_bnb or broadcast_from_rank0 or not full_state_dict:
        raise ValueError(
            "offload_8bit_bnb, broadcast_from_rank0 and full_state_dict=False are not supported by accelerando's "
            "loader; load a full (non-quantized) checkpoint on each process"
        )
    if device_map is not None and "disk" in {str(v) for v in device_map.values()} and offload_folder is None:
        raise ValueError(
            "device_map sends modules to 'disk': pass offload_folder= (where the offload index goes)"
        )
    report = load_checkpoint(
        model,
        checkpoint,
        device_map,
        offload_folder,
        dtype,
        offload_state_dict,
        offload_buffers,
        keep_in_fp32_modules,
        strict,
    )
    if report.offload_index and offload_folder is not None:
        save_offload_index(report.offload_index, offload_folder)
