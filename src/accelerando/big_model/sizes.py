"""Sizes and identities of a model's tensors: the inputs of device-map planning.

Everything here is a pure function of the module tree (works on `meta` tensors), so a plan can be
made for a model that was never materialised.
"""

from __future__ import annotations

import enum
import re
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence

import torch
from torch import nn

_UNITS = {
    "": 1,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "KI": 2**10,
    "MI": 2**20,
    "GI": 2**30,
    "TI": 2**40,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]I?)?(B|b)?\s*$", re.IGNORECASE)
_INT_PREFIXES = ("torch.uint", "torch.int", "torch.bool")


class CustomDtype(enum.Enum):
    """Storage formats without a torch dtype, sized by `dtype_byte_size` (quantized weights)."""

    FP8 = "fp8"
    INT4 = "int4"
    INT2 = "int2"


_CUSTOM_BYTES = {"fp8": 1, "int4": 1 / 2, "int2": 1 / 4}


def dtype_byte_size(dtype: torch.dtype | CustomDtype) -> int | float:
    """Bytes per element: the dtype's item size, 1/8 for bool (Accelerate counts bits there).

    An int for whole bytes and a float below one byte, so module sizes equal Accelerate's exactly.
    A `CustomDtype` (from here or from Accelerate) is sized by its name.
    """
    if isinstance(dtype, enum.Enum) and dtype.value in _CUSTOM_BYTES:
        return _CUSTOM_BYTES[dtype.value]
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype or a CustomDtype, got {dtype!r}")
    return 1 / 8 if dtype == torch.bool else dtype.itemsize


def convert_file_size_to_int(size: int | str) -> int:
    """'10GB' (10**9), '10GiB' (2**30), '500MB', '5Gb' (bits), or an int -> bytes."""
    if isinstance(size, bool):
        raise TypeError(f"size must be an int or a string such as '10GiB', got {size!r}")
    if isinstance(size, int):
        if size < 0:
            raise ValueError(f"size must be >= 0, got {size}")
        return size
    if not isinstance(size, str):
        raise TypeError(f"size must be an int or a string such as '10GiB', got {type(size).__name__}")
    match = _SIZE_RE.match(size)
    if match is None:
        raise ValueError(
            f"size {size!r} is not understood; use an int or a string like '500MB', '10GB', '10GiB'"
        )
    number, unit, suffix = match.groups()
    value = float(number) * _UNITS[(unit or "").upper()]
    if suffix == "b" and unit:
        value /= 8
    return int(value)


def named_module_tensors(
    module: nn.Module,
    include_buffers: bool = True,
    recurse: bool = False,
    remove_non_persistent: bool = False,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Parameters (and buffers) of `module`, optionally without the non-persistent buffers."""
    yield from module.named_parameters(recurse=recurse)
    if not include_buffers:
        return
    skip = get_non_persistent_buffers(module, recurse=recurse, fqns=True) if remove_non_persistent else set()
    for name, buf in module.named_buffers(recurse=recurse):
        if name not in skip:
            yield name, buf


def get_non_persistent_buffers(module: nn.Module, recurse: bool = False, fqns: bool = False) -> set[str]:
    """Names of buffers that are not saved in a state dict (fully qualified when `fqns`)."""
    if not recurse:
        return set(module._non_persistent_buffers_set)
    names: set[str] = set()
    for prefix, sub in module.named_modules():
        for name in sub._non_persistent_buffers_set:
            names.add(f"{prefix}.{name}" if fqns and prefix else name)
    return names


def id_tensor_storage(tensor: torch.Tensor) -> tuple[torch.device, int, int]:
    """A key equal for two tensors that share storage (meta tensors: by identity)."""
    if tensor.device.type == "meta":
        return tensor.device, id(tensor), 0
    storage = tensor.untyped_storage()
    return tensor.device, storage.data_ptr(), storage.nbytes()


def find_tied_parameters(model: nn.Module, **_: object) -> list[list[str]]:
    """Groups of parameter names that are one and the same Parameter, each group sorted, groups sorted."""
    by_id: dict[int, list[str]] = defaultdict(list)
    for name, param in model.named_parameters(remove_duplicate=False):
        by_id[id(param)].append(name)
    return sorted(sorted(names) for names in by_id.values() if len(names) > 1)


def retie_parameters(model: nn.Module, tied_params: Sequence[Sequence[str]]) -> None:
    """Make every name of each group point to the group's first non-meta parameter (after loading)."""
    for group in tied_params:
        params = [_get_tensor(model, name) for name in group]
        source = next((p for p in params if p.device.type != "meta"), params[0])
        for name in group:
            parent, attr = _split_name(model, name)
            parent._parameters[attr] = source  # type: ignore[assignment]


def _split_name(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    module_name, _, attr = name.rpartition(".")
    return (model.get_submodule(module_name) if module_name else model), attr


def _get_tensor(model: nn.Module, name: str) -> torch.Tensor:
    parent, attr = _split_name(model, name)
    tensor: torch.Tensor | None = parent._parameters.get(attr)
    if tensor is None:
        tensor = parent._buffers.get(attr)
    if tensor is None:
        raise ValueError(f"{name!r} is not a parameter or buffer of {type(model).__name__}")
    return tensor


def _tensor_bytes(
    name: str, tensor: torch.Tensor, dtype: torch.dtype | None, special: Mapping[str, torch.dtype]
) -> float:
    """Bytes `tensor` will take once loaded; not rounded (bool tensors count 1/8 byte per element)."""
    if name in special:
        return tensor.numel() * dtype_byte_size(special[name])
    own = dtype_byte_size(tensor.dtype)
    if dtype is None or str(tensor.dtype).startswith(_INT_PREFIXES):
        return tensor.numel() * own
    return tensor.numel() * min(own, dtype_byte_size(dtype))


def compute_module_sizes(
    model: nn.Module,
    dtype: torch.dtype | str | None = None,
    special_dtypes: Mapping[str, torch.dtype | str] | None = None,
    buffers_only: bool = False,
) -> dict[str, float]:
    """Bytes of every module (key "" is the whole model) and tensor; shared tensors count once.

    `dtype` is the dtype the weights will be loaded in (floating tensors only shrink, never grow);
    `special_dtypes` overrides it per tensor name. Sizes are ints unless bool tensors make a
    fraction of a byte (as in Accelerate, so plans made from them agree).
    """
    target = _as_dtype(dtype)
    special = {k: _as_dtype(v) for k, v in (special_dtypes or {}).items()}
    sizes: dict[str, float] = defaultdict(int)
    tensors = model.named_buffers() if buffers_only else named_module_tensors(model, recurse=True)
    for name, tensor in tensors:
        size = _tensor_bytes(name, tensor, target, special)  # type: ignore[arg-type]
        parts = name.split(".")
        for i in range(len(parts) + 1):
            sizes[".".join(parts[:i])] += size
    return sizes


def compute_module_total_buffer_size(
    model: nn.Module,
    dtype: torch.dtype | str | None = None,
    special_dtypes: Mapping[str, torch.dtype] | None = None,
) -> float:
    return compute_module_sizes(model, dtype, special_dtypes, buffers_only=True).get("", 0)


def _as_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str):
        found = getattr(torch, dtype.replace("torch.", ""), None)
        if isinstance(found, torch.dtype):
            return found
    raise ValueError(f"dtype {dtype!r} is not a torch dtype; use e.g. torch.float16 or 'float16'")


def get_max_layer_size(
    modules: Sequence[tuple[str, nn.Module | torch.Tensor]],
    module_sizes: Mapping[str, float],
    no_split_module_classes: Sequence[str],
) -> tuple[float, list[str]]:
    """Largest unsplittable block (a tensor, a leaf module, or a module whose class must not be split)
    and the names of every block of that size (zero-size blocks count when nothing is larger)."""
    best: float = 0
    names: list[str] = []
    stack = list(modules)
    while stack:
        name, module = stack.pop(0)
        children = list(module.named_children()) if isinstance(module, nn.Module) else []
        if not children or type(module).__name__ in no_split_module_classes:
            size = module_sizes.get(name, 0)
            if size > best:
                best, names = size, [name]
            elif size == best:
                names.append(name)
        else:
            stack = [(f"{name}.{n}" if name else n, m) for n, m in children] + stack
    return best, names


def top_level_entries(model: nn.Module) -> list[tuple[str, nn.Module | torch.Tensor]]:
    """What a model is planned from: its own parameters, its children, then its own buffers."""
    return split_entries("", model)


def split_entries(name: str, module: nn.Module) -> list[tuple[str, nn.Module | torch.Tensor]]:
    """The entries that replace `module` when it is split: own parameters, children, own buffers.

    Accelerate leaves a split module's own buffers out (only the top level lists them), which
    leaves them without a device; here they follow the children, as the top level's do.
    """
    prefix = f"{name}." if name else ""
    params = [(prefix + n, p) for n, p in module.named_parameters(recurse=False)]
    children = [(prefix + n, m) for n, m in module.named_children()]
    buffers = [(prefix + n, b) for n, b in module.named_buffers(recurse=False)]
    return [*params, *children, *buffers]


def calculate_maximum_sizes(model: nn.Module) -> tuple[float, tuple[float, list[str]]]:
    """(total bytes, (largest layer bytes, its names)) of `model`."""
    sizes = compute_module_sizes(model)
    no_split = list(getattr(model, "_no_split_modules", None) or [])
    return sizes[""], get_max_layer_size(top_level_entries(model), sizes, no_split)


def get_module_leaves(module_sizes: Mapping[str, float]) -> list[str]:
    """Names in `module_sizes` that have no child entry (tensors and parameter-less modules)."""
    names = [n for n in module_sizes if n]
    parents = {n.rpartition(".")[0] for n in names}
    return [n for n in names if n not in parents]


def check_tied_parameters_in_config(model: nn.Module) -> bool:
    """Whether a transformers model's config asks for tied weights (embeddings or encoder/decoder)."""
    config = getattr(model, "config", None)
    if config is None or not any(c.__name__ == "PreTrainedModel" for c in type(model).__mro__):
        return False
    output_embeddings = getattr(model, "get_output_embeddings", lambda: None)
    word = bool(getattr(config, "tie_word_embeddings", False)) and output_embeddings() is not None
    encoder_decoder = bool(
        getattr(config, "is_encoder_decoder", False) and getattr(config, "tie_encoder_decoder", False)
    )
    return word or encoder_decoder or any(hasattr(m, "_tie_weights") for m in model.modules())
