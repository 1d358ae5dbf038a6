"""Small helpers with Accelerate's names: unwrapping models, pretty names, saving on the main process."""

from __future__ import annotations

import logging
import os
import platform
import re
import sys
from collections.abc import Mapping
from typing import IO, Any

import torch
from packaging.version import Version

from accelerando import _runtime

logger = logging.getLogger(__name__)
# Older kernels can make processes hang (Accelerate issue #1929); warned about, never refused.
MIN_KERNEL_VERSION = "5.5.0"


def extract_model_from_parallel(
    model: torch.nn.Module,
    keep_fp32_wrapper: bool = True,
    keep_torch_compile: bool = True,
    recursive: bool = False,
) -> torch.nn.Module:
    """The user's module inside DDP / FSDP / DataParallel / compile wrappers, in either nesting order."""
    runtime = _runtime.current()
    strategy = runtime.strategy if runtime is not None else None
    return unwrap(model, strategy, keep_fp32_wrapper, keep_torch_compile, recursive)


def _compiled(model: Any) -> bool:
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")  # nothing is compiled before dynamo loads
    return eval_frame is not None and isinstance(model, eval_frame.OptimizedModule)


def unwrap(
    model: torch.nn.Module,
    strategy: Any,
    keep_fp32_wrapper: bool = True,
    keep_torch_compile: bool = True,
    recursive: bool = False,
) -> torch.nn.Module:
    """Peel compile, the strategy's wrapper and data-parallel containers; keep compile on request.

    As in Accelerate, a compiled wrapper that is kept is re-pointed at the bare module.
    """
    from accelerando._prepare import restore_forward

    compiled = None
    if _compiled(model):  # compile(wrapper(model)): a user compiled before `prepare`
        compiled, model = model, model._orig_mod  # type: ignore[assignment]
    if strategy is not None:
        model = strategy.unwrap(model)
    while isinstance(model, torch.nn.parallel.DistributedDataParallel | torch.nn.DataParallel):
        model = model.module
    if compiled is None and _compiled(model):  # wrapper(compile(model)): accelerando's own order
        compiled, model = model, model._orig_mod  # type: ignore[assignment]
    if recursive:
        _unwrap_children(model)
    if not keep_fp32_wrapper:
        restore_forward(model)
    if keep_torch_compile and compiled is not None:
        if compiled._orig_mod is not model:
            compiled._orig_mod = model
        return compiled
    return model


def _unwrap_children(module: torch.nn.Module) -> None:
    for name, child in list(module.named_children()):
        inner = child
        while isinstance(inner, torch.nn.parallel.DistributedDataParallel | torch.nn.DataParallel):
            inner = inner.module
        if inner is not child:
            setattr(module, name, inner)
        _unwrap_children(inner)


def get_pretty_name(obj: Any) -> str:
    if not hasattr(obj, "__qualname__") and not hasattr(obj, "__name__"):
        obj = getattr(obj, "__class__", obj)
    return getattr(obj, "__qualname__", getattr(obj, "__name__", str(obj)))


def wait_for_everyone() -> None:
    from accelerando.state import PartialState

    PartialState().wait_for_everyone()


def save(
    obj: Any,
    f: str | os.PathLike[str] | IO[bytes],
    save_on_each_node: bool = False,
    safe_serialization: bool = False,
) -> None:
    """`torch.save` (or safetensors) on the main process only, or on each node's main process.

    With `safe_serialization`, `obj` must be a dict of tensors; tensors sharing storage are saved once.
    """
    from accelerando.state import PartialState

    state = PartialState()
    if not (state.is_local_main_process if save_on_each_node else state.is_main_process):
        return
    if not safe_serialization:
        torch.save(obj, f)
        return
    from safetensors.torch import save_file

    from accelerando.checkpoint.state_dict import dedupe_shared

    if not isinstance(obj, Mapping) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise TypeError(
            f"save(safe_serialization=True) stores a dict of tensors, got {type(obj).__name__}; "
            "use safe_serialization=False for other objects"
        )
    tensors, _ = dedupe_shared(dict(obj))
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.fspath(f), metadata={"format": "pt"})  # type: ignore[arg-type]


def check_os_kernel() -> None:
    """Warn (main process) when the Linux kernel is older than the recommended 5.5.0."""
    info = platform.uname()
    if info.system != "Linux":
        return
    match = re.search(r"(\d+\.\d+\.\d+)", info.release)
    if match is None:
        return
    version = match.group()
    runtime = _runtime.current()
    if Version(version) < Version(MIN_KERNEL_VERSION) and (runtime is None or runtime.topology.rank == 0):
        logger.warning(
            f"Detected kernel version {version}, which is below the recommended minimum of "
            f"{MIN_KERNEL_VERSION}; this can cause the process to hang. It is recommended to upgrade the "
            "kernel to the minimum version or higher."
        )
