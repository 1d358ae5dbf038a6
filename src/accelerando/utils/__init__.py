"""Accelerate's `accelerate.utils` surface; every name is defined once elsewhere and re-exported."""

from accelerando.checkpoint.atomic import CheckpointError
from accelerando.commands.merge_weights import merge_fsdp_weights
from accelerando.config.env import clear_environment, patch_environment
from accelerando.config.fsdp import (
    FullyShardedDataParallelPlugin,
    disable_fsdp_ram_efficient_loading,
    enable_fsdp_ram_efficient_loading,
)
from accelerando.config.options import (
    AORecipeKwargs,
    AutocastKwargs,
    ComputeEnvironment,
    DataLoaderConfiguration,
    DDPCommunicationHookType,
    DistributedDataParallelKwargs,
    DistributedType,
    DynamoBackend,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    KwargsHandler,
    LoggerType,
    PrecisionType,
    ProfileKwargs,
    ProjectConfiguration,
    RNGType,
    TorchDynamoPlugin,
)
from accelerando.utils.constants import (
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
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
    WEIGHTS_PATTERN_NAME,
)
from accelerando.utils.imports import (
    is_bf16_available,
    is_cuda_available,
    is_deepspeed_available,
    is_fp8_available,
    is_fp16_available,
    is_mlu_available,
    is_mps_available,
    is_npu_available,
    is_rich_available,
    is_safetensors_available,
    is_tensorboard_available,
    is_torch_xla_available,
    is_torchao_available,
    is_torchdata_stateful_dataloader_available,
    is_tqdm_available,
    is_transformers_available,
    is_xpu_available,
)
from accelerando.utils.memory import clear_device_cache, find_executable_batch_size, release_memory
from accelerando.utils.operations import (
    broadcast,
    broadcast_object_list,
    concatenate,
    convert_to_fp32,
    find_batch_size,
    gather,
    gather_object,
    is_namedtuple,
    pad_across_processes,
    recursively_apply,
    reduce,
    send_to_device,
    slice_tensors,
)
from accelerando.utils.other import extract_model_from_parallel, get_pretty_name, wait_for_everyone
from accelerando.utils.random import set_seed, synchronize_rng_state, synchronize_rng_states
from accelerando.utils.tqdm import tqdm
