"""Accelerate's `accelerate.utils.modeling` names (model sizes, device maps, loading); see big_model/."""

from accelerando.big_model.device_map import (
    check_device_map,
    check_tied_parameters_on_same_device,
    clean_device_map,
    get_balanced_memory,
    get_max_memory,
    infer_auto_device_map,
)
from accelerando.big_model.hooks import has_offloaded_params
from accelerando.big_model.loading import load_checkpoint_in_model, load_state_dict
from accelerando.big_model.offload import load_offloaded_weights
from accelerando.big_model.sizes import (
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
