"""Accelerate's `accelerate.utils` surface; every name is defined once elsewhere and re-exported."""

from accelerando.checkpoint.atomic import CheckpointError
from accelerando.config.env import clear_environment, patch_environment
from accelerando.config.fsdp import (
    FullyShardedDataParallelPlugin,
    disable_fsdp_ram_efficient_loading,
    enable_fsdp_ram_efficient_loading,
)
from accelerando.parallel.compile import compile_regions
from accelerando.parallelism_config import ParallelismConfig
from accelerando.utils.constants import (
    BETA_SP_AVAILABLE_DEEPSPEED_VERSION,
    BETA_TP_AVAILABLE_TRANSFORMERS_VERSION,
    MODEL_NAME,
    OPTIMIZER_NAME,
    RNG_STATE_NAME,
    SAFE_MODEL_NAME,
    SAFE_WEIGHTS_INDEX_NAME,
    SAFE_WEIGHTS_NAME,
    SAFE_WEIGHTS_PATTERN_NAME,
    SAMPLER_NAME,
    SCALER_NAME,
    SCHEDULER_NAME,
    SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
    WEIGHTS_PATTERN_NAME,
)
from accelerando.utils.dataclasses import *  # noqa: F403 - one list of names, kept there
from accelerando.utils.deepspeed import (
    DeepSpeedSchedulerWrapper,
    DummyOptim,
    DummyScheduler,
    GatheredParameters,
    HfDeepSpeedConfig,
    get_active_deepspeed_plugin,
)
from accelerando.utils.environment import (
    convert_dict_to_env_variables,
    parse_flag_from_env,
    purge_accelerate_environment,
    str_to_bool,
)
from accelerando.utils.fsdp_merge import merge_fsdp_weights
from accelerando.utils.fsdp_utils import (
    load_fsdp_model,
    load_fsdp_optimizer,
    save_fsdp_model,
    save_fsdp_optimizer,
)
from accelerando.utils.imports import (
    get_torch_accelerator_backend,
    is_aim_available,
    is_bf16_available,
    is_clearml_available,
    is_comet_ml_available,
    is_cuda_available,
    is_datasets_available,
    is_deepspeed_available,
    is_dvclive_available,
    is_fp8_available,
    is_fp16_available,
    is_hpu_available,
    is_mlflow_available,
    is_mlu_available,
    is_mps_available,
    is_npu_available,
    is_pytest_available,
    is_rich_available,
    is_safetensors_available,
    is_swanlab_available,
    is_tensorboard_available,
    is_torch_xla_available,
    is_torchao_available,
    is_torchdata_stateful_dataloader_available,
    is_tqdm_available,
    is_trackio_available,
    is_transformers_available,
    is_wandb_available,
    is_xpu_available,
)
from accelerando.utils.launch import env_var_path_add, prepare_multi_gpu_env, prepare_simple_launcher_cmd_env
from accelerando.utils.memory import clear_device_cache, find_executable_batch_size, release_memory
from accelerando.utils.modeling import (
    align_module_device,
    calculate_maximum_sizes,
    check_device_map,
    check_tied_parameters_in_config,
    check_tied_parameters_on_same_device,
    compute_module_sizes,
    convert_file_size_to_int,
    dtype_byte_size,
    find_tied_parameters,
    get_balanced_memory,
    get_max_layer_size,
    get_max_memory,
    get_module_size_with_ties,
    get_state_dict_from_offload,
    get_state_dict_offloaded_model,
    has_offloaded_params,
    id_tensor_storage,
    infer_auto_device_map,
    load_checkpoint_in_model,
    load_offloaded_weights,
    load_state_dict,
    named_module_tensors,
    retie_parameters,
    set_module_tensor_to_device,
)
from accelerando.utils.offload import (
    OffloadedWeightsLoader,
    PrefixedDataset,
    extract_submodules_state_dict,
    load_offloaded_weight,
    offload_state_dict,
    offload_weight,
    save_offload_index,
)
from accelerando.utils.operations import (
    CannotPadNestedTensorWarning,
    DistributedOperationException,
    broadcast,
    broadcast_object_list,
    concatenate,
    convert_outputs_to_fp32,
    convert_to_fp32,
    copy_tensor_to_devices,
    find_batch_size,
    find_device,
    gather,
    gather_object,
    honor_type,
    is_namedtuple,
    listify,
    pad_across_processes,
    pad_input_tensors,
    recursively_apply,
    reduce,
    send_to_device,
    slice_tensors,
)
from accelerando.utils.other import (
    check_os_kernel,
    extract_model_from_parallel,
    get_pretty_name,
    save,
    wait_for_everyone,
)
from accelerando.utils.random import set_seed, synchronize_rng_state, synchronize_rng_states
from accelerando.utils.tqdm import tqdm
from accelerando.utils.versions import compare_versions, is_torch_version
