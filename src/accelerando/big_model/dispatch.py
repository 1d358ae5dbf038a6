"""Putting a model's blocks on devices and hooking the offloaded ones (Accelerate's big-model API)."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from accelerando.big_model.device_map import (
    DeviceKey,
    check_device_map,
    check_tied_parameters_on_same_device,
    device_for,
    resolve_device_map,
)
from accelerando.big_model.hooks import (
    GUARDED_MOVES,
    AlignDevicesHook,
    CpuOffload,
    ModelHook,
    SequentialHook,
    UserCpuOffloadHook,
    add_hook_to_module,
    attach_align_device_hook,
    attach_align_device_hook_on_blocks,
)
from accelerando.big_model.loading import load_checkpoint
from accelerando.big_model.offload import (
    AliasedWeights,
    OffloadedWeightsLoader,
    PrefixedDataset,
    offload_state_dict,
)
from accelerando.big_model.sizes import find_tied_parameters, named_module_tensors, retie_parameters
from accelerando.big_model.tensors import DeviceLike, as_torch_device, set_module_tensor_to_device

logger = logging.getLogger(__name__)


def _check_values(device_map: Mapping[str, Any]) -> None:
    for name, device in device_map.items():
        if device == "disk":
            continue
        try:
            as_torch_device(device)
        except (ValueError, RuntimeError) as err:
            raise ValueError(
                f"device_map[{name!r}] = {device!r} is not a device: use an accelerator index, 'cpu', 'mps', "
                f"'disk' or a torch.device ({err})"
            ) from None


def _key(device: DeviceKey | torch.device) -> str:
    return str(device) if not isinstance(device, int) else f"index:{device}"


def _main_device(device_map: Mapping[str, Any], main_device: DeviceLike | None) -> DeviceLike:
    if main_device is not None:
        return main_device
    return next((d for d in device_map.values() if d not in ("cpu", "disk")), "cpu")


def _is_module(model: nn.Module, name: str) -> bool:
    try:
        model.get_submodule(name)
    except AttributeError:
        return False
    return True


def _tensors_under(
    model: nn.Module, name: str, offloadable_only: bool = False, buffers: bool = True
) -> list[str]:
    """Tensor names under an entry; with `offloadable_only`, those an offload hook serves."""
    if not _is_module(model, name):
        parent, _, attr = name.rpartition(".")
        module = model.get_submodule(parent) if parent else model
        keep = not offloadable_only or attr in module._parameters
        keep = keep or (buffers and attr not in module._non_persistent_buffers_set)
        return [name] if keep else []
    prefix = f"{name}." if name else ""
    module = model.get_submodule(name)
    if offloadable_only:
        tensors = named_module_tensors(
            module, include_buffers=buffers, recurse=True, remove_non_persistent=True
        )
    else:
        tensors = named_module_tensors(module, recurse=True)
    return [prefix + n for n, _ in tensors]


def _has_forward(module: nn.Module) -> bool:
    return getattr(type(module).forward, "__name__", "") != "_forward_unimplemented"


def expand_containers(model: nn.Module, device_map: Mapping[str, Any]) -> dict[str, Any]:
    """Replace entries naming containers that are never called (ModuleList, ModuleDict) by their children.

    Hooks fire on forward calls, so an offload hook must sit on modules that are called.
    """
    expanded: dict[str, Any] = {}
    for name, device in device_map.items():
        if not _is_module(model, name) or _has_forward(module := model.get_submodule(name)):
            expanded[name] = device
            continue
        prefix = f"{name}." if name else ""
        inner = {prefix + n: device for n, _ in named_module_tensors(module, recurse=False)}
        inner.update({prefix + n: device for n, _ in module.named_children()})
        expanded.update(expand_containers(model, inner))
    return expanded


def _raise_on_meta(model: nn.Module, served: set[str], what: str) -> None:
    stranded = [
        n for n, t in named_module_tensors(model, recurse=True) if t.device.type == "meta" and n not in served
    ]
    if stranded:
        shown = ", ".join(stranded[:12]) + (f" ... ({len(stranded)} in all)" if len(stranded) > 12 else "")
        raise ValueError(
            f"{what}: these tensors are still on 'meta' and no offload hook serves them: {shown}. Load them from a "
            "checkpoint (load_checkpoint_in_model / load_checkpoint_and_dispatch) or map them to 'disk' with their "
            "weights in offload_dir"
        )


def _weights_map(
    model: nn.Module,
    device_map: Mapping[str, Any],
    offloaded: set[str],
    state_dict: Mapping[str, torch.Tensor] | None,
    offload_dir: str | os.PathLike[str] | None,
    offload_index: Mapping[str, Any] | None,
    tied: list[list[str]],
    offload_buffers: bool,
) -> Mapping[str, torch.Tensor]:
    """Where offloaded weights are read from: cpu tensors in memory, else the offload index/folder."""
    memory: dict[str, torch.Tensor] = dict(state_dict or {})
    to_write: dict[str, torch.Tensor] = {}
    index = dict(offload_index or {})
    if not index and offload_dir is not None and (Path(offload_dir) / "index.json").exists():
        index = OffloadedWeightsLoader(save_folder=offload_dir).index
    for name, device in device_map.items():
        if device not in offloaded:
            continue
        for tensor_name in _tensors_under(model, name, offloadable_only=True, buffers=offload_buffers):
            tensor = _get(model, tensor_name)
            if tensor.device.type == "meta" or tensor_name in memory or tensor_name in index:
                continue
            if device == "disk":
                to_write[tensor_name] = tensor
            else:
                memory[tensor_name] = tensor.detach().to("cpu")
    if to_write:
        if offload_dir is None:
            raise ValueError(
                f"{len(to_write)} tensor(s) are mapped to 'disk': pass offload_dir= to write them"
            )
        offload_state_dict(offload_dir, to_write)
        index = OffloadedWeightsLoader(save_folder=offload_dir).index
    loader = OffloadedWeightsLoader(state_dict=memory, save_folder=offload_dir, index=index)
    aliases = {n: next(m for m in g if m in loader) for g in tied if any(m in loader for m in g) for n in g}
    return AliasedWeights(loader, {k: v for k, v in aliases.items() if k not in loader})


def _get(model: nn.Module, name: str) -> torch.Tensor:
    parent, _, attr = name.rpartition(".")
    module = model.get_submodule(parent) if parent else model
    tensor = module._parameters.get(attr)
    return tensor if tensor is not None else module._buffers[attr]  # type: ignore[return-value]


def _place_resident(model: nn.Module, device_map: Mapping[str, Any], offloaded: set[str]) -> None:
    """Move every non-offloaded entry to its device; meta tensors there are an error."""
    stranded: list[str] = []
    for name, device in device_map.items():
        if device in offloaded:
            continue
        target = as_torch_device(device)
        for tensor_name in _tensors_under(model, name):
            tensor = _get(model, tensor_name)
            if tensor.device.type == "meta":
                stranded.append(tensor_name)
            elif tensor.device != target:
                set_module_tensor_to_device(model, tensor_name, target)
    if stranded:
        _raise_on_meta(model, set(), "dispatch_model")


def _hooks_of(module: nn.Module) -> list[AlignDevicesHook]:
    hook: ModelHook | None = getattr(module, "_hf_hook", None)
    if hook is None:
        return []
    hooks = hook.hooks if isinstance(hook, SequentialHook) else [hook]
    return [h for h in hooks if isinstance(h, AlignDevicesHook) and h.offload and h.offloaded_names()]


def link_prefetch_chain(model: nn.Module) -> set[str]:
    """Chain offload hooks in module order (each prefetches what follows, up to the largest block's
    bytes ahead); returns the names they serve."""
    chain: list[AlignDevicesHook] = []
    served: set[str] = set()
    for module_name, module in model.named_modules():
        for hook in _hooks_of(module):
            chain.append(hook)
            prefix = f"{module_name}." if module_name else ""
            served.update(prefix + n for n in hook.offloaded_names())
    largest = max((hook.offloaded_bytes() for hook in chain), default=0)
    for current, following in zip(chain, chain[1:] + chain[:1]):
        current.next_hook = following
        current.prefetch_bytes = largest
    return served


def _hook_tensor_entries(
    model: nn.Module,
    entries: list[str],
    main: DeviceLike,
    weights: Mapping[str, torch.Tensor],
    offload_buffers: bool,
) -> None:
    """Offloaded entries that name single tensors: one offload hook on each parent module."""
    parents: dict[str, list[str]] = {}
    for name in entries:
        parents.setdefault(name.rpartition(".")[0], []).append(name)
    for parent, names in parents.items():
        module = model.get_submodule(parent) if parent else model
        prefix = f"{parent}." if parent else ""
        own = {
            prefix + n for n, _ in named_module_tensors(module, offload_buffers, remove_non_persistent=True)
        }
        if not own <= set(names):
            raise ValueError(
                f"device_map offloads {sorted(names)} but keeps {sorted(own - set(names))} of the same module "
                f"{parent or '<root>'!r} resident; map the whole module instead"
            )
        hook = AlignDevicesHook(
            main, offload=True, weights_map=PrefixedDataset(weights, prefix), offload_buffers=offload_buffers
        )
        add_hook_to_module(module, hook, append=True)


def _attach_hooks(
    model: nn.Module,
    device_map: Mapping[str, Any],
    main: DeviceLike,
    offloaded: set[str],
    weights: Mapping[str, torch.Tensor],
    offload_buffers: bool,
    skip_keys: str | Sequence[str] | None,
    preload_module_classes: Sequence[str] | None,
    force_hooks: bool,
) -> None:
    """Offload hooks on offloaded blocks; input-moving hooks on resident ones only if devices differ."""
    resident = {_key(d) for d in device_map.values() if d not in offloaded}
    many = len(resident | {_key(main)}) > 1 or force_hooks
    execution: dict[str, DeviceLike] = {}
    offload: dict[str, bool] = {}
    tensor_entries = []
    for name, device in device_map.items():
        if device in offloaded and not _is_module(model, name):
            tensor_entries.append(name)
        elif device in offloaded or many:
            execution[name] = main if device in offloaded else device
            offload[name] = device in offloaded
    attach_align_device_hook_on_blocks(
        model,
        execution,
        offload,
        weights,
        offload_buffers,
        skip_keys=skip_keys,
        preload_module_classes=preload_module_classes,
        tied_params_map={},
    )
    if tensor_entries:
        _hook_tensor_entries(model, tensor_entries, main, weights, offload_buffers)


def dispatch_model(
    model: nn.Module,
    device_map: Mapping[str, DeviceLike],
    main_device: DeviceLike | None = None,
    state_dict: Mapping[str, torch.Tensor] | None = None,
    offload_dir: str | os.PathLike[str] | None = None,
    offload_index: Mapping[str, Any] | None = None,
    offload_buffers: bool = False,
    skip_keys: str | Sequence[str] | None = None,
    preload_module_classes: Sequence[str] | None = None,
    force_hooks: bool = False,
) -> nn.Module:
    """Place `model` per `device_map`; offloaded blocks get hooks that fetch weights per forward.

    A map with one device and no offload only moves the model (no hooks, so `torch.compile` sees a
    plain module). Sets `model.hf_device_map`. Raises if a tensor would be left on `meta` unserved.
    """
    if not isinstance(device_map, Mapping) or not device_map:
        raise ValueError(f"device_map must be a non-empty dict of module name -> device, got {device_map!r}")
    _check_values(device_map)
    check_device_map(model, device_map)
    tied = find_tied_parameters(model)
    check_tied_parameters_on_same_device(tied, device_map)  # type: ignore[arg-type]
    if skip_keys is None:
        skip_keys = getattr(model, "_skip_keys_device_placement", None)
    kinds = {_key(d) for d in device_map.values()}
    if len(kinds) == 1 and "disk" not in kinds and not force_hooks:
        _raise_on_meta(model, set(), "dispatch_model")
        model.to(as_torch_device(next(iter(device_map.values()))))
        model.hf_device_map = dict(device_map)  # type: ignore[assignment]
        return model
    original_map = dict(device_map)
    device_map = expand_containers(model, device_map)
    main = _main_device(device_map, main_device)
    offloaded = {"disk"} if _key(main) in ("cpu", "mps") else {"cpu", "disk"}
    weights = _weights_map(
        model, device_map, offloaded, state_dict, offload_dir, offload_index, tied, offload_buffers
    )
    _place_resident(model, device_map, offloaded)
    retie_parameters(model, [g for g in tied if len({_key(device_for(n, device_map)) for n in g}) == 1])
    _attach_hooks(
        model,
        device_map,
        main,
        offloaded,
        weights,
        offload_buffers,
        skip_keys,
        preload_module_classes,
        force_hooks,
    )
    _raise_on_meta(model, link_prefetch_chain(model), "dispatch_model")
    _guard_moves(model)
    model.hf_device_map = original_map  # type: ignore[assignment]
    return model


def _guard_moves(model: nn.Module) -> None:
    """`model.to(device)` / `.cuda()` on a dispatched model: refuse while weights are offloaded, else warn.

    dtype-only `.to(torch.float16)` passes (offload hooks cast served weights to the meta dtype).
    """
    names = [n for n in ("to", "cuda", "xpu", "npu", "mlu") if hasattr(model, n)]
    for name in names:
        setattr(model, name, _guarded(getattr(model, name), model, name))
    setattr(model, GUARDED_MOVES, names)


def _guarded(fn: Any, model: nn.Module, name: str) -> Any:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if name == "to" and torch._C._nn._parse_to(*args, **kwargs)[0] is None:
            return fn(*args, **kwargs)
        if any(p.device.type == "meta" for p in model.parameters()):
            raise RuntimeError(
                f"model.{name}() on a model with offloaded weights: they live on disk/cpu and are served by "
                "hooks; call accelerando.hooks.remove_hook_from_submodules(model) and load it fully first"
            )
        logger.warning("moving a model dispatched over several devices: its device hooks still apply")
        return fn(*args, **kwargs)

    return wrapper


def _first_device(model: nn.Module) -> torch.device:
    first = next(model.parameters(), None)
    return torch.device("cpu") if first is None or first.device.type == "meta" else first.device


def cpu_offload(
    model: nn.Module,
    execution_device: DeviceLike | None = None,
    offload_buffers: bool = False,
    state_dict: Mapping[str, torch.Tensor] | None = None,
    preload_module_classes: Sequence[str] | None = None,
) -> nn.Module:
    """Keep all weights on cpu; each submodule gets them on `execution_device` only while it runs."""
    if state_dict is None:
        state_dict = {name: t.detach().to("cpu") for name, t in model.state_dict().items()}
    return _serve_offloaded(model, state_dict, execution_device, offload_buffers, preload_module_classes)


def _serve_offloaded(
    model: nn.Module,
    weights: Mapping[str, Any],
    execution_device: DeviceLike | None,
    offload_buffers: bool,
    preload_module_classes: Sequence[str] | None,
) -> nn.Module:
    """Hook every submodule to fetch its weights from `weights` onto the device while it runs."""
    device = execution_device if execution_device is not None else _first_device(model)
    attach_align_device_hook(
        model,
        device,
        offload=True,
        weights_map=weights,
        offload_buffers=offload_buffers,
        preload_module_classes=preload_module_classes,
    )
    add_hook_to_module(model, AlignDevicesHook(io_same_device=True), append=True)
    link_prefetch_chain(model)
    return model


def cpu_offload_with_hook(
    model: nn.Module,
    execution_device: DeviceLike | None = None,
    prev_module_hook: UserCpuOffloadHook | None = None,
) -> tuple[nn.Module, UserCpuOffloadHook]:
    """Whole-model offload: moved to the device on call, back to cpu when the next model runs."""
    hook = CpuOffload(execution_device=execution_device, prev_module_hook=prev_module_hook)
    add_hook_to_module(model, hook, append=True)
    return model, UserCpuOffloadHook(model, hook)


def disk_offload(
    model: nn.Module,
    offload_dir: str | os.PathLike[str],
    execution_device: DeviceLike | None = None,
    offload_buffers: bool = False,
    preload_module_classes: Sequence[str] | None = None,
) -> nn.Module:
    """Write the weights to `offload_dir` (unless an index is there) and serve them memory-mapped."""
    if not (Path(offload_dir) / "index.json").exists():
        offload_state_dict(offload_dir, model.state_dict())
    weights = OffloadedWeightsLoader(save_folder=offload_dir)
    return _serve_offloaded(model, weights, execution_device, offload_buffers, preload_module_classes)


def load_checkpoint_and_dispatch(
    model: nn.Module,
    checkpoint: str | os.PathLike[str],
    device_map: str | Mapping[str, DeviceLike] | None = None,
    max_memory: Mapping[DeviceKey, int | str] | None = None,
    no_split_module_classes: Sequence[str] | None = None,
    offload_folder: str | os.PathLike[str] | None = None,
    offload_buffers: bool = False,
    dtype: torch.dtype | str | None = None,
    offload_state_dict: bool | None = None,
    skip_keys: str | Sequence[str] | None = None,
    preload_module_classes: Sequence[str] | None = None,
    force_hooks: bool = False,
    strict: bool = False,
    full_state_dict: bool = True,
    broadcast_from_rank0: bool = False,
) -> nn.Module:
    """Plan (for "auto"/"balanced"/...), load and dispatch in one call.

    Disk-mapped weights from safetensors are served from the checkpoint files themselves, so
    `offload_folder` is only needed for `.bin` checkpoints or weights that must be written.
    """
    if broadcast_from_rank0 or not full_state_dict:
        raise ValueError(
            "broadcast_from_rank0 and full_state_dict=False are not supported; load on each process"
        )
    resolved = resolve_device_map(
        model, device_map, max_memory, no_split_module_classes, dtype, offload_buffers
    )  # type: ignore[arg-type]
    report = load_checkpoint(
        model,
        checkpoint,
        resolved,
        offload_folder,
        dtype,
        bool(offload_state_dict),  # type: ignore[arg-type]
        offload_buffers,
        strict=strict,
    )
    if resolved is None:
        _raise_on_meta(model, set(), "load_checkpoint_and_dispatch")
        return model
    return dispatch_model(
        model,
        resolved,
        offload_dir=offload_folder,
        offload_index=report.offload_index,  # type: ignore[arg-type]
        offload_buffers=offload_buffers,
        skip_keys=skip_keys,
        preload_module_classes=preload_module_classes,
        force_hooks=force_hooks,
    )
