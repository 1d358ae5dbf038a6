"""Accelerate's `accelerate.big_modeling` names; defined in `accelerando.big_model`."""

from accelerando.big_model.casting import attach_layerwise_casting_hooks
from accelerando.big_model.device_map import (
    check_device_map,
    get_balanced_memory,
    get_max_memory,
    infer_auto_device_map,
)
from accelerando.big_model.dispatch import (
    cpu_offload,
    cpu_offload_with_hook,
    disk_offload,
    dispatch_model,
    load_checkpoint_and_dispatch,
)
from accelerando.big_model.hooks import (
    AlignDevicesHook,
    CpuOffload,
    UserCpuOffloadHook,
    add_hook_to_module,
    attach_align_device_hook,
    attach_align_device_hook_on_blocks,
    remove_hook_from_module,
)
from accelerando.big_model.init import init_empty_weights, init_on_device
from accelerando.big_model.loading import load_checkpoint_in_model
from accelerando.big_model.offload import OffloadedWeightsLoader, PrefixedDataset, offload_state_dict
from accelerando.big_model.sizes import compute_module_sizes, find_tied_parameters, retie_parameters
from accelerando.big_model.tensors import send_to_device, set_module_tensor_to_device

__all__ = [
    "AlignDevicesHook",
    "CpuOffload",
    "OffloadedWeightsLoader",
    "PrefixedDataset",
    "UserCpuOffloadHook",
    "add_hook_to_module",
    "attach_align_device_hook",
    "attach_align_device_hook_on_blocks",
    "attach_layerwise_casting_hooks",
    "check_device_map",
    "compute_module_sizes",
    "cpu_offload",
    "cpu_offload_with_hook",
    "disk_offload",
    "dispatch_model",
    "find_tied_parameters",
    "get_balanced_memory",
    "get_max_memory",
    "infer_auto_device_map",
    "init_empty_weights",
    "init_on_device",
    "load_checkpoint_and_dispatch",
    "load_checkpoint_in_model",
    "offload_state_dict",
    "remove_hook_from_module",
    "retie_parameters",
    "send_to_device",
    "set_module_tensor_to_device",
]
