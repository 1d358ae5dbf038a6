"""Availability probes with Accelerate's names, answered by the device registry and importlib."""

from __future__ import annotations

import importlib.metadata
import importlib.util
from functools import cache
from typing import Any

import torch

from accelerando.devices import accelerator_device, get_device


@cache
def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def get_torch_accelerator_backend(check_available: bool = True) -> tuple[str | None, Any]:
    """(device type, its torch module) of the machine's accelerator, or (None, None) on a CPU-only one."""
    device = accelerator_device()
    if device.type == "cpu" or (check_available and not device.is_available()):
        return None, None
    return device.type, device.module()


def is_cuda_available() -> bool:
    return get_device("cuda").is_available()


def is_xpu_available(check_device: bool = False) -> bool:
    return get_device("xpu").is_available()


def is_npu_available(check_device: bool = False) -> bool:
    return _has("torch_npu") and get_device("npu").is_available()


def is_mlu_available(check_device: bool = False) -> bool:
    return _has("torch_mlu") and get_device("mlu").is_available()


def is_mps_available(min_version: str = "1.12") -> bool:
    return get_device("mps").is_available()


def is_torch_xla_available(check_is_tpu: bool = False, check_is_gpu: bool = False) -> bool:
    return get_device("xla").is_available()


def is_bf16_available(ignore_tpu: bool = False) -> bool:
    """Whether bf16 compute works on this process's accelerator (always on CPU)."""
    if is_torch_xla_available():
        return not ignore_tpu
    if torch.accelerator.is_available():
        current = torch.accelerator.current_accelerator()
        if current is not None and current.type in ("cuda", "xpu", "npu", "mlu"):
            return get_device(current.type).supports_dtype(torch.bfloat16)
    return True


def is_fp16_available() -> bool:
    return True


def is_fp8_available() -> bool:
    return _has("torchao") or _has("transformer_engine")


def is_rich_available() -> bool:
    return _has("rich")


def is_tqdm_available() -> bool:
    return _has("tqdm")


def is_safetensors_available() -> bool:
    return _has("safetensors")


def is_transformers_available() -> bool:
    return _has("transformers")


def is_deepspeed_available() -> bool:
    return _has("deepspeed")


def is_torchao_available() -> bool:
    return _has("torchao")


def is_torchdata_stateful_dataloader_available() -> bool:
    return _has("torchdata") and _has("torchdata.stateful_dataloader")


def is_tensorboard_available() -> bool:
    return _has("tensorboard") or _has("tensorboardX")


def is_wandb_available() -> bool:
    return _has("wandb")


def is_mlflow_available() -> bool:
    return _has("mlflow")


def is_aim_available() -> bool:
    return _has("aim")


def is_comet_ml_available() -> bool:
    return _has("comet_ml")


def is_clearml_available() -> bool:
    return _has("clearml")


def is_dvclive_available() -> bool:
    return _has("dvclive")


def is_swanlab_available() -> bool:
    return _has("swanlab")


def is_trackio_available() -> bool:
    return _has("trackio")


def is_datasets_available() -> bool:
    return _has("datasets")


def is_pytest_available() -> bool:
    return _has("pytest")


@cache
def is_hpu_available(init_hccl: bool = False) -> bool:
    """Whether Intel Gaudi's PyTorch bridge is installed and sees an HPU (no accelerando backend yet)."""
    if not (_has("habana_frameworks") and _has("habana_frameworks.torch")):
        return False
    importlib.import_module("habana_frameworks.torch")
    if init_hccl:
        importlib.import_module("habana_frameworks.torch.distributed.hccl")
    hpu = getattr(torch, "hpu", None)
    return hpu is not None and bool(hpu.is_available())


def _installed(module: str, distribution: str | None = None) -> bool:
    """Importable and installed as a distribution (what Accelerate's probes check: a stray folder
    of that name on the path is not the package)."""
    if not _has(module):
        return False
    names = [distribution] if distribution else [module, module.replace("_", "-")]
    for name in names:
        try:
            importlib.metadata.version(name)
            return True
        except importlib.metadata.PackageNotFoundError:
            continue
    return False


def _package_probe(module: str, distribution: str | None = None) -> Any:
    """An `is_<package>_available()` with Accelerate's name: whether the package is installed."""

    def probe() -> bool:
        return _installed(module, distribution)

    probe.__doc__ = f"Whether `{module}` is installed."
    return probe


is_peft_available = _package_probe("peft")
is_timm_available = _package_probe("timm")
is_torchvision_available = _package_probe("torchvision")
is_pandas_available = _package_probe("pandas")
is_matplotlib_available = _package_probe("matplotlib")
is_boto3_available = _package_probe("boto3")
is_schedulefree_available = _package_probe("schedulefree")
is_lomo_available = _package_probe("lomo_optim")
is_torchdata_available = _package_probe("torchdata")
is_sagemaker_available = _package_probe("sagemaker")
is_import_timer_available = _package_probe("import_timer")
is_amdsmi_available = _package_probe("amdsmi")


def is_pynvml_available() -> bool:
    return _installed("pynvml") or _installed("pynvml", "nvidia-ml-py")


def is_triton_available() -> bool:
    return _installed("triton", "triton-xpu") if is_xpu_available() else _installed("triton")


def is_transformer_engine_available() -> bool:
    if is_hpu_available():
        return _installed("intel_transformer_engine", "intel-transformer-engine")
    return _installed("transformer_engine", "transformer-engine")


def is_bnb_available(min_version: str | None = None) -> bool:
    """Whether bitsandbytes is installed (at `min_version` or later, when given)."""
    if not _installed("bitsandbytes"):
        return False
    if min_version is None:
        return True
    from packaging.version import Version

    return Version(importlib.metadata.version("bitsandbytes")) >= Version(min_version)


def is_4bit_bnb_available() -> bool:
    return is_bnb_available("0.39.0")


def is_8bit_bnb_available() -> bool:
    return is_bnb_available("0.37.2")


def is_rocm_available() -> bool:
    return torch.version.hip is not None and get_device("cuda").is_available()


def is_xccl_available() -> bool:
    return bool(torch.distributed.is_available() and torch.distributed.distributed_c10d.is_xccl_available())


def _vendor_device(module: str, device: str, check_device: bool) -> bool:
    """A vendor backend (torch_musa, torch_sdaa, torch_neuronx): installed, and with
    `check_device` also seeing a device (accelerando has no backend for these yet)."""
    if not _has(module):
        return False
    importlib.import_module(module)
    if not check_device:
        return True
    mod = getattr(torch, device, None)
    try:
        return mod is not None and mod.device_count() > 0
    except RuntimeError:
        return False


def is_musa_available(check_device: bool = False) -> bool:
    return _vendor_device("torch_musa", "musa", check_device)


def is_sdaa_available(check_device: bool = False) -> bool:
    return _vendor_device("torch_sdaa", "sdaa", check_device)


def is_neuron_available(check_device: bool = False) -> bool:
    return _vendor_device("torch_neuronx", "neuron", check_device)


def is_megatron_lm_available() -> bool:
    """False: accelerando has no Megatron-LM integration (README "Not there yet")."""
    return False


def is_habana_gaudi1() -> bool:
    """Whether the HPU is a first-generation Gaudi (Habana's own device query)."""
    if not is_hpu_available():
        return False
    htexp = importlib.import_module("habana_frameworks.torch.utils.experimental")
    return bool(htexp._get_device_type() == htexp.synDeviceType.synDeviceGaudi)


def is_bitsandbytes_multi_backend_available() -> bool:
    if not is_bnb_available():
        return False
    return "multi_backend" in getattr(importlib.import_module("bitsandbytes"), "features", set())


def is_transformer_engine_mxfp8_available() -> bool:
    if not _installed("transformer_engine", "transformer-engine"):
        return False
    fp8 = importlib.import_module("transformer_engine.pytorch.fp8")
    return bool(fp8.check_mxfp8_support()[0])


def get_distributed_backend(device_type: str | None) -> str | None:
    """The torch.distributed backend Accelerate pairs with `device_type`; None when there is none
    (CPU: accelerando uses gloo there) or XPU without xccl."""
    from accelerando.utils.constants import TORCH_DISTRIBUTED_BACKENDS

    if device_type == "xpu" and not is_xccl_available():
        return None
    return TORCH_DISTRIBUTED_BACKENDS.get(device_type or "")


def get_current_device_type() -> tuple[str, str]:
    """(device type, distributed type name) a launcher would use here, no accelerator initialised."""
    device_type, _ = get_torch_accelerator_backend(check_available=False)
    if device_type is None:
        return "cpu", "NO"
    if get_distributed_backend(device_type) is None:
        return device_type, "NO"
    return device_type, "MULTI_GPU" if device_type == "cuda" else f"MULTI_{device_type.upper()}"


def torchao_required(func: Any) -> Any:
    """Decorator: calling `func` without torchao installed raises an ImportError saying so."""
    import functools

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not is_torchao_available():
            raise ImportError(f"{func.__qualname__} needs `torchao`: pip install torchao")
        return func(*args, **kwargs)

    return wrapper


def deepspeed_required(func: Any) -> Any:
    """Decorator: calling `func` once an Accelerator runs another strategy than DeepSpeed raises."""
    import functools

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from accelerando import _runtime
        from accelerando.utils.dataclasses import DistributedType

        runtime = _runtime.current()
        if (
            runtime is not None
            and runtime.accelerator_ready
            and runtime.distributed_type != DistributedType.DEEPSPEED
        ):
            raise ValueError(
                f"DeepSpeed is not enabled ({runtime.distributed_type}): {func.__qualname__} needs an Accelerator "
                "configured for deepspeed"
            )
        return func(*args, **kwargs)

    return wrapper
