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


def convert_bytes(size: float) -> str:
    """`size` bytes in the largest unit under 1024 of it, rounded to 2 places (Accelerate's spelling)."""
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if size < 1024.0:
            return f"{round(size, 2)} {unit}"
        size /= 1024.0
    return f"{round(size, 2)} PB"


def merge_dicts(source: dict[Any, Any], destination: dict[Any, Any]) -> dict[Any, Any]:
    """Merge `source` into `destination` in place, nested dicts key by key; returns `destination`."""
    for key, value in source.items():
        if isinstance(value, dict):
            merge_dicts(value, destination.setdefault(key, {}))
        else:
            destination[key] = value
    return destination


def recursive_getattr(obj: Any, attr: str) -> Any:
    """`obj.a.b.c` for `attr="a.b.c"`."""
    for name in attr.split("."):
        obj = getattr(obj, name)
    return obj


def is_compiled_module(module: Any) -> bool:
    """Whether `module` is the wrapper `torch.compile` returns."""
    return _compiled(module)


def has_compiled_regions(module: torch.nn.Module) -> bool:
    """Whether a submodule (or the module, when it has children) was compiled on its own."""
    return bool(module._modules) and any(_compiled(m) for m in module.modules())


def model_has_dtensor(model: torch.nn.Module) -> bool:
    """Whether any parameter is a DTensor (FSDP2 / tensor parallelism)."""
    if not torch.distributed.is_available():
        return False
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def is_port_in_use(port: int | None = None) -> bool:
    """Whether something listens on `localhost:port` (29500, torch's default, when not given)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        return sock.connect_ex(("localhost", 29500 if port is None else port)) == 0


def get_module_children_bottom_up(model: torch.nn.Module, return_fqns: bool = False) -> list[Any]:
    """Every module, each listed after all of its descendants, `model` last (the order FSDP2 wraps
    in); with `return_fqns`, (qualified name, module) pairs. Same order as Accelerate's."""
    order: list[tuple[str, torch.nn.Module]] = []
    stack: list[tuple[str, torch.nn.Module]] = [("", model)]
    while stack:  # pre-order with the last child first; its reverse lists children before parents
        name, module = stack.pop()
        order.append((name, module))
        stack += [(f"{name}.{child}" if name else child, m) for child, m in module.named_children()]
    order.reverse()
    return order if return_fqns else [m for _, m in order]


def clean_state_dict_for_safetensors(state_dict: dict[str, Any]) -> dict[str, Any]:
    """Keep one name per shared storage (safetensors refuses aliases) with a warning naming the
    dropped ones, and make every tensor contiguous. `state_dict` loses the dropped keys too."""
    from accelerando.big_model.sizes import id_tensor_storage

    first: dict[Any, str] = {}
    dropped = []
    for name, tensor in list(state_dict.items()):
        if isinstance(tensor, torch.Tensor):
            key = id_tensor_storage(tensor)
            if key in first:
                dropped.append(name)
                del state_dict[name]
            else:
                first[key] = name
    if dropped:
        logger.warning(
            "Removed shared tensor %s while saving. This should be OK, but check by verifying that you "
            "don't receive any warning while reloading",
            set(dropped),
        )
    return {k: v.contiguous() if isinstance(v, torch.Tensor) else v for k, v in state_dict.items()}


def load(f: Any, map_location: Any = None, **kwargs: Any) -> Any:
    """`torch.load` with `weights_only=True` unless asked otherwise, also accepting the numpy
    arrays and dtypes that saved RNG states hold (Accelerate's drop-in for its checkpoints)."""
    import codecs

    import numpy as np

    kwargs.setdefault("weights_only", True)
    core = np._core if hasattr(np, "_core") else np.core
    extra: list[Any] = [np.ndarray, np.dtype, core.multiarray._reconstruct, codecs.encode]
    extra += [t for t in vars(getattr(np, "dtypes", object)).values() if isinstance(t, type)]
    with torch.serialization.safe_globals(extra):
        return torch.load(f, map_location=map_location, **kwargs)


def get_model_tp_size(model: torch.nn.Module) -> int | None:
    """The tensor-parallel degree a transformers model was sharded with (`model.tp_size` before
    transformers 5, its config's `distributed_config` since), None when it was not."""
    tp_size = getattr(model, "tp_size", None)
    if tp_size is not None:
        return int(tp_size)
    config = getattr(getattr(model, "config", None), "distributed_config", None)
    value = config.get("tp_size") if isinstance(config, dict) else getattr(config, "tp_size", None)
    return None if value is None else int(value)
