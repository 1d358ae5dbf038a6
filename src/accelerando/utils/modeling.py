"""Accelerate's `accelerate.utils.modeling` names (model sizes, device maps, loading); see big_model/."""

import logging
from collections.abc import Mapping, Sequence

import torch
from torch import nn

from accelerando.big_model.device_map import (
    check_device_map,
    check_tied_parameters_on_same_device,
    clean_device_map,
    get_balanced_memory,
    get_max_memory,
    infer_auto_device_map,
    size_with_ties,
    tie_owners,
)
from accelerando.big_model.hooks import has_offloaded_params
from accelerando.big_model.loading import load_checkpoint_in_model, load_state_dict
from accelerando.big_model.offload import load_offloaded_weights
from accelerando.big_model.sizes import (
    CustomDtype,
    calculate_maximum_sizes,
    check_tied_parameters_in_config,
    compute_module_sizes,
    compute_module_total_buffer_size,
    convert_file_size_to_int,
    dtype_byte_size,
    find_tied_parameters,
    get_max_layer_size,
    get_module_leaves,
    get_non_persistent_buffers,
    id_tensor_storage,
    named_module_tensors,
    retie_parameters,
)
from accelerando.big_model.tensors import align_module_device, set_module_tensor_to_device

__all__ = [
    "CustomDtype",
    "align_module_device",
    "calculate_maximum_sizes",
    "check_device_map",
    "check_tied_parameters_in_config",
    "check_tied_parameters_on_same_device",
    "clean_device_map",
    "compute_module_sizes",
    "compute_module_total_buffer_size",
    "convert_file_size_to_int",
    "dtype_byte_size",
    "find_tied_parameters",
    "get_balanced_memory",
    "get_max_layer_size",
    "get_max_memory",
    "get_module_leaves",
    "get_non_persistent_buffers",
    "has_offloaded_params",
    "id_tensor_storage",
    "infer_auto_device_map",
    "load_checkpoint_in_model",
    "load_offloaded_weights",
    "load_state_dict",
    "named_module_tensors",
    "retie_parameters",
    "set_module_tensor_to_device",
]

# ---- defined here: helpers only this compatibility surface needs ----
logger = logging.getLogger(__name__)


def get_module_size_with_ties(
    tied_params: Sequence[str],
    module_size: float,
    module_sizes: Mapping[str, float],
    modules_to_treat: Sequence[tuple[str, nn.Module]],
) -> tuple[float, list[str], list[nn.Module]]:
    """Size of a module placed together with the modules holding the other ends of its tied parameters.

    Each tied parameter is found in the first of `modules_to_treat` that contains it; that module's
    size is added, less the tied parameter itself (counted once already).
    Returns (size, names of those modules, the modules).
    """
    owners = tie_owners(tied_params, modules_to_treat)
    for param, owner in zip(tied_params, owners):
        if owner is None:
            raise ValueError(
                f"tied parameter {param!r} is in none of the modules to treat "
                f"({[n for n, _ in modules_to_treat]})"
            )
    found = [o for o in owners if o is not None]
    size = size_with_ties(tied_params, module_size, module_sizes, owners)
    return size, [n for n, _ in found], [m for _, m in found]  # type: ignore[misc]


def get_state_dict_offloaded_model(model: nn.Module) -> dict[str, torch.Tensor]:
    """The full state dict, on CPU, of a model whose weights are offloaded (CPU or disk) by hooks.

    Each offloaded block is brought to CPU in turn, so only one block is materialised at a time;
    tensors still on `meta` (never loaded) are left out with a warning.
    """
    state_dict: dict[str, torch.Tensor] = {}
    on_meta: list[str] = []

    def take(entries: Mapping[str, object]) -> None:
        for key, value in entries.items():
            if not isinstance(value, torch.Tensor):
                continue
            if value.device.type == "meta":
                on_meta.append(key)
            else:
                state_dict[key] = value.detach().to("cpu")

    def visit(module: nn.Module, prefix: str) -> None:
        if has_offloaded_params(module):
            try:
                with align_module_device(module, "cpu"):
                    take(module.state_dict(prefix=prefix))
            except MemoryError:
                raise MemoryError("Offloaded module must fit in CPU memory to call save_model!") from None
            return
        own: dict[str, object] = {}
        module._save_to_state_dict(own, prefix, keep_vars=False)
        take(own)
        for name, child in module.named_children():
            visit(child, f"{prefix}{name}.")

    visit(model, "")
    missing = sorted(set(on_meta) - set(state_dict))
    if missing:
        logger.warning(
            f"The following tensors were not saved because they were still on meta device: {missing}"
        )
    return state_dict


def get_state_dict_from_offload(
    module: nn.Module,
    module_name: str,
    state_dict: dict[str, torch.Tensor | str],
    device_to_put_offload: int | str | torch.device = "cpu",
) -> dict[str, torch.Tensor | str]:
    """Fill `state_dict`'s entries for `module` (named by one of its tensors, `module_name`) with its
    tensors; an offloaded module's weights are first brought to `device_to_put_offload`."""
    root = module_name.rpartition(".")[0]
    device = device_to_put_offload if has_offloaded_params(module) else None
    with align_module_device(module, device):
        for key, value in module.state_dict().items():
            full = f"{root}.{key}"
            if full in state_dict:
                state_dict[full] = value
    return state_dict


__all__ += ["get_module_size_with_ties", "get_state_dict_from_offload", "get_state_dict_offloaded_model"]


def is_peft_model(model: nn.Module) -> bool:
    """Whether `model`, once out of its DDP / compile wrappers, is a peft `PeftModel`."""
    from accelerando.utils.imports import is_peft_available
    from accelerando.utils.other import extract_model_from_parallel

    if not is_peft_available():
        return False
    from peft import PeftModel

    return isinstance(extract_model_from_parallel(model), PeftModel)


__all__ += ["is_peft_model"]


def normalize_device(device: int | str | torch.device) -> int | str | torch.device:
    """Accelerate's spelling of a device-map value: an integer index names the machine's
    accelerator (`"xpu:1"`; CUDA keeps the bare integer, an HPU is `"hpu"`), `"npu"` is `"npu:0"`."""
    from accelerando.utils.imports import get_torch_accelerator_backend

    if device == "npu":
        return "npu:0"
    if isinstance(device, int) and not isinstance(device, bool):
        device_type, _ = get_torch_accelerator_backend(check_available=False)
        if device_type == "hpu":
            return "hpu"
        if device_type not in (None, "cuda"):
            return f"{device_type}:{device}"
    return device


__all__ += ["normalize_device"]
