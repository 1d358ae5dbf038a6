"""accelerando: one PyTorch script on CPU, GPUs, many machines; Accelerate's API, a smaller inside."""

from accelerando._as_accelerate import as_accelerate
from accelerando._import_noise import silence_known_import_noise
from accelerando._version import __version__
from accelerando.accelerator import Accelerator
from accelerando.big_modeling import (
    cpu_offload,
    cpu_offload_with_hook,
    disk_offload,
    dispatch_model,
    init_empty_weights,
    init_on_device,
    load_checkpoint_and_dispatch,
)
from accelerando.config.deepspeed import DeepSpeedPlugin
from accelerando.config.fsdp import FullyShardedDataParallelPlugin
from accelerando.config.options import (
    AORecipeKwargs,
    AutocastKwargs,
    DataLoaderConfiguration,
    DDPCommunicationHookType,
    DistributedDataParallelKwargs,
    DistributedType,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    MSAMPRecipeKwargs,
    ProfileKwargs,
    ProjectConfiguration,
    TERecipeKwargs,
)
from accelerando.data_loader import skip_first_batches
from accelerando.inference import prepare_pippy
from accelerando.launchers import debug_launcher, notebook_launcher
from accelerando.parallelism_config import ParallelismConfig
from accelerando.state import PartialState
from accelerando.utils.imports import is_rich_available
from accelerando.utils.memory import find_executable_batch_size
from accelerando.utils.modeling import infer_auto_device_map, load_checkpoint_in_model
from accelerando.utils.random import synchronize_rng_states


def _install_rich_tracebacks() -> None:
    from accelerando.config import env

    if env.flag("ENABLE_RICH") and is_rich_available():
        from rich.traceback import install

        install(show_locals=False)


def _apply_as_accelerate_switch() -> None:
    """`ACCELERANDO_AS_ACCELERATE=1` (what `accelerando launch --as_accelerate` exports) switches at import."""
    from accelerando.config import env

    if env.flag("AS_ACCELERATE"):
        as_accelerate()


_install_rich_tracebacks()
_apply_as_accelerate_switch()
silence_known_import_noise()

__all__ = [
    "AORecipeKwargs",
    "MSAMPRecipeKwargs",
    "TERecipeKwargs",
    "Accelerator",
    "AutocastKwargs",
    "DDPCommunicationHookType",
    "DataLoaderConfiguration",
    "DeepSpeedPlugin",
    "DistributedDataParallelKwargs",
    "DistributedType",
    "FullyShardedDataParallelPlugin",
    "GradScalerKwargs",
    "GradientAccumulationPlugin",
    "InitProcessGroupKwargs",
    "ParallelismConfig",
    "PartialState",
    "as_accelerate",
    "cpu_offload",
    "cpu_offload_with_hook",
    "disk_offload",
    "dispatch_model",
    "infer_auto_device_map",
    "init_empty_weights",
    "init_on_device",
    "load_checkpoint_and_dispatch",
    "load_checkpoint_in_model",
    "prepare_pippy",
    "debug_launcher",
    "notebook_launcher",
    "skip_first_batches",
    "ProfileKwargs",
    "ProjectConfiguration",
    "find_executable_batch_size",
    "is_rich_available",
    "synchronize_rng_states",
]
