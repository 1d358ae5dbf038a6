"""Availability probes with Accelerate's names, answered by the device registry and importlib."""

from __future__ import annotations

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
