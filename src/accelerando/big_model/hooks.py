"""Forward hooks that move inputs and weights where a module runs.

A hook wraps `module.forward` (the original is kept as `module._old_forward`, the hook as
`module._hf_hook`: transformers and peft look both up by name). `AlignDevicesHook` with
`offload=True` keeps the module's weights on `meta` between calls and materialises them from a
weights map (cpu state dict or memory-mapped files) for the duration of one forward.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

import torch
from torch import nn

from accelerando.big_model import prefetch as device_prefetch
from accelerando.big_model.offload import PrefixedDataset
from accelerando.big_model.sizes import get_non_persistent_buffers, named_module_tensors
from accelerando.big_model.tensors import (
    DeviceLike,
    as_torch_device,
    send_to_device,
    set_module_tensor_to_device,
)

GUARDED_MOVES = "_accelerando_guarded_moves"


class ModelHook:
    """Base hook: override any of init/pre_forward/post_forward/detach; `no_grad` wraps the call."""

    no_grad = False

    def init_hook(self, module: nn.Module) -> nn.Module:
        return module

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        return args, kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        return output

    def detach_hook(self, module: nn.Module) -> nn.Module:
        return module


class SequentialHook(ModelHook):
    """Several hooks run in order (pre_forward first to last, post_forward too)."""

    def __init__(self, *hooks: ModelHook) -> None:
        self.hooks = list(hooks)

    def init_hook(self, module: nn.Module) -> nn.Module:
        for hook in self.hooks:
            module = hook.init_hook(module)
        return module

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        for hook in self.hooks:
            args, kwargs = hook.pre_forward(module, *args, **kwargs)
        return args, kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        for hook in self.hooks:
            output = hook.post_forward(module, output)
        return output

    def detach_hook(self, module: nn.Module) -> nn.Module:
        for hook in self.hooks:
            module = hook.detach_hook(module)
        return module


def _hooked_forward(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    hook: ModelHook = module._hf_hook  # type: ignore[assignment]
    args, kwargs = hook.pre_forward(module, *args, **kwargs)
    if hook.no_grad:
        with torch.no_grad():
            output = module._old_forward(*args, **kwargs)  # type: ignore[operator]
    else:
        output = module._old_forward(*args, **kwargs)  # type: ignore[operator]
    return hook.post_forward(module, output)


def add_hook_to_module(module: nn.Module, hook: ModelHook, append: bool = False) -> nn.Module:
    """Wrap `module.forward` with `hook` (replacing any hook, or chaining after it with `append`)."""
    if not isinstance(hook, ModelHook):
        raise TypeError(f"hook must be a ModelHook, got {type(hook).__name__}")
    existing = getattr(module, "_hf_hook", None)
    if existing is not None and not append:
        remove_hook_from_module(module)
        existing = None
    module = hook.init_hook(module)
    if existing is not None:
        setattr(module, "_hf_hook", SequentialHook(existing, hook))  # noqa: B010
        return module
    old_forward = module.forward
    setattr(module, "_old_forward", old_forward)  # noqa: B010
    setattr(module, "_hf_hook", hook)  # noqa: B010
    wrapped = functools.update_wrapper(functools.partial(_hooked_forward, module), old_forward)
    setattr(module, "forward", wrapped)  # noqa: B010
    return module


def remove_hook_from_module(module: nn.Module, recurse: bool = False) -> nn.Module:
    """Detach the hook and restore the original forward (recursively with `recurse`)."""
    hook = module.__dict__.pop("_hf_hook", None)
    if hook is not None:
        hook.detach_hook(module)
    old = module.__dict__.pop("_old_forward", None)
    if old is not None:
        is_class_forward = getattr(old, "__self__", None) is module and getattr(
            old, "__func__", None
        ) is getattr(type(module), "forward", None)
        if is_class_forward:
            module.__dict__.pop("forward", None)
        else:
            module.forward = old  # type: ignore[method-assign]
    for name in module.__dict__.pop(GUARDED_MOVES, ()):
        module.__dict__.pop(name, None)
    if recurse:
        for child in module.children():
            remove_hook_from_module(child, recurse=True)
    return module


def has_offloaded_params(module: nn.Module) -> bool:
    """Whether `module` has an offload hook (its weights live elsewhere between forwards)."""
    hook = getattr(module, "_hf_hook", None)
    hooks = hook.hooks if isinstance(hook, SequentialHook) else [hook]
    return any(isinstance(h, AlignDevicesHook) and h.offload for h in hooks)


def remove_hook_from_submodules(module: nn.Module) -> None:
    """Remove hooks from `module` and every submodule."""
    remove_hook_from_module(module, recurse=True)


class AlignDevicesHook(ModelHook):
    """Runs a module on `execution_device`; with `offload`, fetches its weights for each call.

    `io_same_device` returns outputs on the device the inputs came from. `place_submodules`
    covers the tensors of the whole subtree (one hook per block), else only the module's own.
    `next_hook` (set by `dispatch_model`) is the next offloaded block: while this one runs, the
    following blocks are prefetched until `prefetch_bytes` (the largest block's size) are on their
    way, so a tiny block (a final norm) does not leave a large one after it (the head) unfetched.
    On an accelerator they are copied on a side stream; see `prefetch.py`.
    """

    def __init__(
        self,
        execution_device: DeviceLike | None = None,
        offload: bool = False,
        io_same_device: bool = False,
        weights_map: Mapping[str, torch.Tensor] | None = None,
        offload_buffers: bool = False,
        place_submodules: bool = False,
        skip_keys: str | Sequence[str] | None = None,
        tied_params_map: dict[int, dict[torch.device, torch.Tensor]] | None = None,
    ) -> None:
        self.execution_device = execution_device
        self.offload = offload
        self.io_same_device = io_same_device
        self.weights_map = weights_map
        self.offload_buffers = offload_buffers
        self.place_submodules = place_submodules
        self.skip_keys = skip_keys
        self.tied_params_map = tied_params_map
        self.input_device: torch.device | None = None
        self.next_hook: AlignDevicesHook | None = None
        self.prefetch_bytes = 0
        self.original_devices: dict[str, torch.device] = {}
        self._slots: list[tuple[str, nn.Module, str, bool, torch.Tensor]] = []
        self._pending: device_prefetch.PendingWeights | None = None

    def __repr__(self) -> str:
        return (
            f"AlignDevicesHook(execution_device={self.execution_device}, offload={self.offload}, "
            f"io_same_device={self.io_same_device}, offload_buffers={self.offload_buffers}, "
            f"place_submodules={self.place_submodules}, skip_keys={self.skip_keys!r})"
        )

    def _device(self) -> torch.device | None:
        return None if self.execution_device is None else as_torch_device(self.execution_device)

    def init_hook(self, module: nn.Module) -> nn.Module:
        device = self._device()
        recurse = self.place_submodules
        if not self.offload:
            if device is not None:
                for name, _ in named_module_tensors(module, recurse=recurse):
                    set_module_tensor_to_device(module, name, device, tied_params_map=self.tied_params_map)
            return module
        self.original_devices = {n: t.device for n, t in named_module_tensors(module, recurse=recurse)}
        offloaded = list(
            named_module_tensors(module, self.offload_buffers, recurse=recurse, remove_non_persistent=True)
        )
        if self.weights_map is None:
            self.weights_map = {n: t.detach().to("cpu") for n, t in offloaded}
        self._slots = []
        for name, tensor in offloaded:
            parent_name, _, attr = name.rpartition(".")
            parent = module.get_submodule(parent_name) if parent_name else module
            is_buffer = attr in parent._buffers
            meta = tensor if tensor.device.type == "meta" else tensor.detach().to("meta")
            if not is_buffer:
                meta = nn.Parameter(meta, requires_grad=tensor.requires_grad)
            self._set(parent, attr, is_buffer, meta)
            self._slots.append((name, parent, attr, is_buffer, meta))
        self._place_resident_buffers(module, device, {n for n, *_ in self._slots})
        return module

    def _place_resident_buffers(
        self, module: nn.Module, device: torch.device | None, offloaded: set[str]
    ) -> None:
        """Buffers that are not offloaded (or not persistent) live on the execution device."""
        if device is None:
            return
        names = [n for n, _ in module.named_buffers(recurse=self.place_submodules) if n not in offloaded]
        if self.offload_buffers:
            non_persistent = get_non_persistent_buffers(module, recurse=self.place_submodules, fqns=True)
            names = [n for n in names if n in non_persistent]
        for name in names:
            current = module.get_buffer(name)
            value = None
            if current.device.type == "meta":
                if self.weights_map is None or name not in self.weights_map:
                    raise ValueError(f"buffer {name!r} is on meta and not in the offloaded weights")
                value = self.weights_map[name]
            set_module_tensor_to_device(module, name, device, value=value)

    @staticmethod
    def _set(parent: nn.Module, attr: str, is_buffer: bool, value: torch.Tensor) -> None:
        if is_buffer:
            parent._buffers[attr] = value
        else:
            parent._parameters[attr] = value  # type: ignore[assignment]

    def offloaded_names(self) -> list[str]:
        return [name for name, *_ in self._slots]

    def offloaded_bytes(self) -> int:
        """Bytes this block's weights take on the execution device."""
        return sum(meta.numel() * meta.element_size() for *_, meta in self._slots)

    def prefetch_following(self) -> None:
        """Prefetch the next blocks in the chain, starting each while less than `prefetch_bytes` are ahead."""
        ahead, hook = 0, self.next_hook
        while hook is not None and hook is not self and (ahead == 0 or ahead < self.prefetch_bytes):
            hook.prefetch()
            ahead += hook.offloaded_bytes()
            hook = hook.next_hook

    def _requests(self) -> tuple[list[str], list[torch.dtype]]:
        return [name for name, *_ in self._slots], [meta.dtype for *_, meta in self._slots]

    def prefetch(self) -> None:
        """Start bringing this block's weights in (page cache on cpu; device copy on accelerators)."""
        if not self._slots or self.weights_map is None:
            return
        hint = getattr(self.weights_map, "prefetch", None)
        if hint is not None:
            hint(self.offloaded_names())
        device = self._device()
        fetcher = None if device is None or self._pending is not None else device_prefetch.fetcher_for(device)
        if fetcher is not None:
            self._pending = fetcher.start(self.weights_map, *self._requests())

    def _materialise(self) -> None:
        device = self._device()
        assert self.weights_map is not None and device is not None
        names, dtypes = self._requests()
        pending, self._pending = self._pending, None
        fetcher = device_prefetch.fetcher_for(device)
        if fetcher is None:
            values = [_fetch(self.weights_map, name, device, dtype) for name, dtype in zip(names, dtypes)]
        else:
            if (
                pending is None
                or pending.fetcher is not fetcher
                or pending.key != (tuple(names), tuple(dtypes))
            ):
                pending = fetcher.start(self.weights_map, names, dtypes)
            values = pending.wait()
        for (_name, parent, attr, is_buffer, meta), value in zip(self._slots, values):
            value = self._shared(value, device)
            if not is_buffer:
                value = nn.Parameter(value, requires_grad=meta.requires_grad and value.is_floating_point())
            self._set(parent, attr, is_buffer, value)

    def _shared(self, value: torch.Tensor, device: torch.device) -> torch.Tensor:
        if self.tied_params_map is None or device.type == "cpu":
            return value
        return self.tied_params_map.setdefault(value.data_ptr(), {}).setdefault(device, value)

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        if self.io_same_device:
            self.input_device = _first_device((args, kwargs))
        if self.offload and self._slots:
            self._materialise()
            self.prefetch_following()
        device = self.execution_device
        return send_to_device(args, device), send_to_device(kwargs, device, skip_keys=self.skip_keys)

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        if self.offload:
            for _name, parent, attr, is_buffer, meta in self._slots:
                self._set(parent, attr, is_buffer, meta)
            if self.tied_params_map is not None:
                self.tied_params_map.clear()
        if self.io_same_device and self.input_device is not None:
            output = send_to_device(output, self.input_device, skip_keys=self.skip_keys)
        return output

    def detach_hook(self, module: nn.Module) -> nn.Module:
        self._pending = None
        if self.offload and self.weights_map is not None:
            for name, parent, attr, is_buffer, meta in self._slots:
                device = self.original_devices.get(name, torch.device("meta"))
                if device.type != "meta":
                    self._set(parent, attr, is_buffer, meta)
                    set_module_tensor_to_device(module, name, device, value=self.weights_map[name])
        return module


def _fetch(
    weights: Mapping[str, torch.Tensor], name: str, device: torch.device, dtype: torch.dtype
) -> torch.Tensor:
    """A served weight on a cpu execution device: the stored tensor itself unless it needs a cast."""
    value = weights[name]
    cast = device_prefetch.served_dtype(value, dtype)
    if value.device == device and cast is None:
        return value
    return value.to(device, dtype=cast)


def _first_device(data: Any) -> torch.device | None:
    if isinstance(data, torch.Tensor):
        return data.device
    if isinstance(data, Mapping):
        data = list(data.values())
    if isinstance(data, (list, tuple)):
        for item in data:
            found = _first_device(item)
            if found is not None:
                return found
    return None


class CpuOffload(ModelHook):
    """Keeps a whole model on cpu and moves it to `execution_device` when it is called."""

    def __init__(
        self, execution_device: DeviceLike | None = None, prev_module_hook: UserCpuOffloadHook | None = None
    ):
        self.execution_device = execution_device
        self.prev_module_hook = prev_module_hook

    def init_hook(self, module: nn.Module) -> nn.Module:
        return module.to("cpu")

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple[tuple, dict]:
        if self.prev_module_hook is not None:
            self.prev_module_hook.offload()
        if self.execution_device is not None:
            module.to(as_torch_device(self.execution_device))
        return send_to_device(args, self.execution_device), send_to_device(kwargs, self.execution_device)


class UserCpuOffloadHook:
    """Handle returned by `cpu_offload_with_hook`: `offload()` sends the model back to cpu."""

    def __init__(self, model: nn.Module, hook: CpuOffload) -> None:
        self.model = model
        self.hook = hook

    def offload(self) -> None:
        self.hook.init_hook(self.model)

    def remove(self) -> None:
        remove_hook_from_module(self.model)


def attach_execution_device_hook(
    module: nn.Module,
    execution_device: DeviceLike,
    skip_keys: str | Sequence[str] | None = None,
    preload_module_classes: Sequence[str] | None = None,
    tied_params_map: dict | None = None,
) -> None:
    """Give every submodule with tensors a hook that moves its inputs to `execution_device`."""
    if getattr(module, "_hf_hook", None) is None and next(named_module_tensors(module), None) is not None:
        add_hook_to_module(
            module, AlignDevicesHook(execution_device, skip_keys=skip_keys, tied_params_map=tied_params_map)
        )
    if preload_module_classes is not None and type(module).__name__ in preload_module_classes:
        return
    for child in module.children():
        attach_execution_device_hook(
            child, execution_device, skip_keys, preload_module_classes, tied_params_map
        )


def attach_align_device_hook(
    module: nn.Module,
    execution_device: DeviceLike | None = None,
    offload: bool = False,
    weights_map: Mapping[str, torch.Tensor] | None = None,
    offload_buffers: bool = False,
    module_name: str = "",
    skip_keys: str | Sequence[str] | None = None,
    preload_module_classes: Sequence[str] | None = None,
    tied_params_map: dict | None = None,
) -> None:
    """Hook each submodule that owns tensors (whole subtrees for `preload_module_classes`)."""
    own = next(named_module_tensors(module, include_buffers=offload_buffers), None) is not None
    whole = offload and preload_module_classes is not None and type(module).__name__ in preload_module_classes
    if own or whole:
        prefixed = weights_map
        if weights_map is not None and module_name:
            prefixed = PrefixedDataset(weights_map, f"{module_name}.")
        hook = AlignDevicesHook(
            execution_device,
            offload,
            weights_map=prefixed,
            offload_buffers=offload_buffers,
            place_submodules=whole,
            skip_keys=skip_keys,
            tied_params_map=tied_params_map,
        )
        add_hook_to_module(module, hook, append=True)
    if whole:
        return
    for child_name, child in module.named_children():
        attach_align_device_hook(
            child,
            execution_device,
            offload,
            weights_map,
            offload_buffers,
            f"{module_name}.{child_name}" if module_name else child_name,
            skip_keys,
            preload_module_classes,
            tied_params_map,
        )


def _attach_uniform(
    module: nn.Module,
    execution_device: DeviceLike | None,
    offload: bool,
    weights_map: Mapping[str, torch.Tensor] | None,
    offload_buffers: bool,
    module_name: str,
    skip_keys: str | Sequence[str] | None,
    preload_module_classes: Sequence[str] | None,
    tied_params_map: dict | None,
) -> None:
    """`attach_align_device_hook_on_blocks` with one device for everything."""
    if offload:
        attach_align_device_hook(
            module,
            execution_device,
            True,
            weights_map,
            offload_buffers,
            module_name,
            skip_keys,
            preload_module_classes,
            tied_params_map,
        )
        return
    hook = AlignDevicesHook(
        execution_device,
        io_same_device=True,
        skip_keys=skip_keys,
        place_submodules=True,
        tied_params_map=tied_params_map,
    )
    add_hook_to_module(module, hook)


def attach_align_device_hook_on_blocks(
    module: nn.Module,
    execution_device: DeviceLike | MutableMapping[str, DeviceLike] | None = None,
    offload: bool | Mapping[str, bool] = False,
    weights_map: Mapping[str, torch.Tensor] | None = None,
    offload_buffers: bool = False,
    module_name: str = "",
    skip_keys: str | Sequence[str] | None = None,
    preload_module_classes: Sequence[str] | None = None,
    tied_params_map: dict | None = None,
) -> None:
    """One hook per block named in `execution_device`/`offload` (dicts keyed by module name).

    An offloaded block gets one hook for its whole subtree (so its weights can be fetched, and
    prefetched, together); a resident block gets one that moves its inputs.
    """
    if not isinstance(execution_device, Mapping) and not isinstance(offload, Mapping):
        _attach_uniform(
            module,
            execution_device,
            bool(offload),
            weights_map,
            offload_buffers,
            module_name,
            skip_keys,
            preload_module_classes,
            tied_params_map,
        )
        return
    names: Any = execution_device if isinstance(execution_device, Mapping) else offload
    devices: Any = (
        execution_device if isinstance(execution_device, Mapping) else dict.fromkeys(names, execution_device)
    )
    offloads: Any = offload if isinstance(offload, Mapping) else dict.fromkeys(names, offload)
    if module_name in devices:
        is_offloaded = bool(offloads.get(module_name, False))
        prefixed = weights_map
        if is_offloaded and weights_map is not None and module_name:
            prefixed = PrefixedDataset(weights_map, f"{module_name}.")
        hook = AlignDevicesHook(
            devices[module_name],
            is_offloaded,
            module_name == "",
            prefixed if is_offloaded else None,
            offload_buffers,
            place_submodules=True,
            skip_keys=skip_keys,
            tied_params_map=tied_params_map,
        )
        add_hook_to_module(module, hook)
        return
    if module_name == "":
        add_hook_to_module(
            module, AlignDevicesHook(devices.get(""), io_same_device=True, skip_keys=skip_keys)
        )
    for child_name, child in module.named_children():
        child_full = f"{module_name}.{child_name}" if module_name else child_name
        attach_align_device_hook_on_blocks(
            child,
            devices,
            offloads,
            weights_map,
            offload_buffers,
            child_full,
            skip_keys,
            preload_module_classes,
            tied_params_map,
        )
