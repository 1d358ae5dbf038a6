"""Device-map planning: pure functions of (module tree, memory budget) -> {module name: device}.

Same inputs give the same map; nothing here touches a device except `get_max_memory()` when it is
asked to measure the machine (pass `max_memory` to keep it pure).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from accelerando.big_model.sizes import (
    check_tied_parameters_in_config,
    compute_module_sizes,
    convert_file_size_to_int,
    find_tied_parameters,
    get_max_layer_size,
    named_module_tensors,
)

logger = logging.getLogger(__name__)

DeviceKey = int | str
DEVICE_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")
_NAMED_DEVICES = ("mps", "cpu", "disk")


def get_max_memory(max_memory: Mapping[DeviceKey, int | str] | None = None) -> dict[DeviceKey, int]:
    """Budget per device, accelerators first (by index), then "mps", "cpu", "disk".

    Without `max_memory` the machine is measured: free memory of each accelerator and available RAM.
    """
    if max_memory is None:
        return _measure_memory()
    converted: dict[DeviceKey, int] = {}
    for key, value in max_memory.items():
        if isinstance(key, bool) or not (isinstance(key, int) or key in _NAMED_DEVICES):
            raise ValueError(
                f"max_memory key {key!r} is not a device; accepted: accelerator indices (0, 1, ...), "
                "'mps', 'cpu', 'disk'"
            )
        converted[key] = convert_file_size_to_int(value)
    indices = sorted(k for k in converted if isinstance(k, int))
    order: list[DeviceKey] = [*indices, *(n for n in _NAMED_DEVICES if n in converted)]
    return {k: converted[k] for k in order}


def _measure_memory() -> dict[DeviceKey, int]:
    from accelerando.devices import accelerator_device, get_device

    budget: dict[DeviceKey, int] = {}
    device = accelerator_device()
    if device.type == "mps":
        budget["mps"] = get_device("cpu").mem_get_info()[0]
    elif device.type != "cpu":
        for index in range(device.device_count()):
            budget[index] = device.mem_get_info(index)[0]
    budget["cpu"] = get_device("cpu").mem_get_info()[0]
    return budget


def get_balanced_memory(
    model: nn.Module,
    max_memory: Mapping[DeviceKey, int | str] | None = None,
    no_split_module_classes: Sequence[str] | None = None,
    dtype: torch.dtype | str | None = None,
    special_dtypes: Mapping[str, torch.dtype] | None = None,
    low_zero: bool = False,
) -> dict[DeviceKey, int]:
    """Shrink accelerator budgets so a sequential fill spreads the model evenly over them.

    Each accelerator gets an equal share plus room for its largest unsplittable layer; with
    `low_zero` the first one gets as little as possible (it keeps room for `generate()` buffers).
    """
    budget = get_max_memory(max_memory)
    accel = [k for k in budget if isinstance(k, int) or k == "mps"]
    if len(accel) <= 1:
        return budget
    sizes = compute_module_sizes(model, dtype, special_dtypes)
    no_split = list(no_split_module_classes or [])
    layer, _ = get_max_layer_size(list(model.named_children()), sizes, no_split)
    sharing = accel[1:] if low_zero else accel
    share = -(-sizes[""] // len(sharing)) + layer
    balanced = dict(budget)
    for key in sharing:
        balanced[key] = min(budget[key], share)
    if low_zero:
        rest = sum(balanced[k] for k in sharing)
        balanced[accel[0]] = min(budget[accel[0]], max(0, sizes[""] - rest) + layer)
    return balanced


@dataclass
class _Plan:
    """Mutable state of one planning pass (kept in one place so each step is a small function)."""

    budget: dict[DeviceKey, int]
    devices: list[DeviceKey]
    sizes: Mapping[str, int]
    no_split: set[str]
    ties: list[list[str]]
    pending: list[tuple[str, nn.Module | torch.Tensor]]
    fallback: bool
    buffer_sizes: Mapping[str, int] = field(default_factory=dict)
    index: int = 0
    used: dict[DeviceKey, int] = field(default_factory=dict)
    device_map: dict[str, DeviceKey] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def device(self) -> DeviceKey:
        return self.devices[self.index]

    def remaining(self) -> int:
        return sum(self.sizes.get(name, 0) for name, _ in self.pending)

    def reserve(self, device: DeviceKey, incoming: int) -> int:
        """Room kept on an execution device for one offloaded layer, unless all that is left fits."""
        if device not in self._main_devices() or self.remaining() + incoming <= self.free(device):
            return 0
        layer, _ = get_max_layer_size(self.pending, self.sizes, sorted(self.no_split))
        return layer + sum(self.buffer_sizes.get(name, 0) for name, _ in self.pending)

    def charge_buffers(self, name: str, device: DeviceKey) -> None:
        """Buffers of an offloaded entry stay on the execution device (unless offload_buffers)."""
        main = self._main_devices()[0]
        if device != main and (device == "disk" or main != "cpu") and self.buffer_sizes.get(name):
            self.used[main] = self.used.get(main, 0) + self.buffer_sizes[name]

    def _main_devices(self) -> list[DeviceKey]:
        accel = [d for d in self.devices if d not in ("cpu", "disk")]
        return [accel[0], "cpu"] if accel else ["cpu"]

    def free(self, device: DeviceKey) -> int:
        return self.budget[device] - self.used.get(device, 0)

    def assign(self, name: str, device: DeviceKey, size: int, why: str = "") -> None:
        self.device_map[name] = device
        self.used[device] = self.used.get(device, 0) + size
        self.charge_buffers(name, device)
        if why:
            self.notes.append(f"{name} -> {device}: {why}")


def _tied_partners(plan: _Plan, name: str) -> list[tuple[str, nn.Module | torch.Tensor]]:
    """Pending entries holding a parameter tied to one inside `name` (they must share its device)."""
    inside = [t for group in plan.ties for t in group if _within(t, name)]
    if not inside:
        return []
    tied = {t for group in plan.ties if any(t in group for t in inside) for t in group}
    return [
        (other, mod)
        for other, mod in plan.pending
        if other != name and any(_within(t, other) for t in tied) and not _within(other, name)
    ]


def _within(tensor_name: str, prefix: str) -> bool:
    return prefix == "" or tensor_name == prefix or tensor_name.startswith(prefix + ".")


def _children(
    name: str, module: nn.Module | torch.Tensor, plan: _Plan
) -> list[tuple[str, nn.Module | torch.Tensor]]:
    """What `module` splits into, or [] when it must stay whole."""
    if isinstance(module, torch.Tensor) or type(module).__name__ in plan.no_split:
        return []
    kids = list(module.named_children())
    if not kids:
        return []
    prefix = f"{name}." if name else ""
    tensors = list(named_module_tensors(module, recurse=False))
    return [(prefix + n, t) for n, t in tensors] + [(prefix + n, m) for n, m in kids]


def _place_next(plan: _Plan) -> None:
    """Place, split or push back the first pending entry (one step of the sequential fill)."""
    name, module = plan.pending.pop(0)
    device = plan.device
    partners = _tied_partners(plan, name)
    size = plan.sizes.get(name, 0) + sum(plan.sizes.get(n, 0) for n, _ in partners)
    if device == "disk":
        for entry in [name, *(n for n, _ in partners)]:
            plan.assign(entry, "disk", plan.sizes.get(entry, 0))
        _drop(plan, partners)
        return
    reserve = plan.reserve(device, size)
    room = plan.free(device) - reserve
    if size <= room:
        plan.assign(name, device, plan.sizes.get(name, 0))
        for other, _ in partners:
            plan.assign(other, device, plan.sizes.get(other, 0), f"tied to a parameter in {name}")
        _drop(plan, partners)
        return
    kids = _children(name, module, plan)
    if kids:
        plan.notes.append(f"{name} ({size} B) does not fit in {room} B on {device}: split into its children")
        plan.pending = kids + plan.pending
        return
    if plan.fallback and _fallback(plan, device, room):
        plan.pending.insert(0, (name, module))
        return
    kept = f" after keeping {reserve} B to run offloaded layers" if reserve else ""
    plan.notes.append(f"{name} ({size} B) does not fit in {room} B left on {device}{kept}: next device")
    plan.pending.insert(0, (name, module))
    plan.index += 1


def _drop(plan: _Plan, entries: list[tuple[str, nn.Module | torch.Tensor]]) -> None:
    names = {n for n, _ in entries}
    plan.pending = [(n, m) for n, m in plan.pending if n not in names]


def _fallback(plan: _Plan, device: DeviceKey, room: int) -> bool:
    """Before leaving a device that got nothing, put on it the first later entry that fits."""
    if plan.used.get(device, 0) > 0:
        return False
    for pos, (name, _module) in enumerate(plan.pending):
        if not _tied_partners(plan, name) and 0 < plan.sizes.get(name, 0) <= room:
            plan.pending.pop(pos)
            plan.assign(name, device, plan.sizes[name], "fallback allocation: the next entry was too big")
            return True
    return False


def infer_auto_device_map(
    model: nn.Module,
    max_memory: Mapping[DeviceKey, int | str] | None = None,
    no_split_module_classes: Sequence[str] | None = None,
    dtype: torch.dtype | str | None = None,
    special_dtypes: Mapping[str, torch.dtype] | None = None,
    verbose: bool = False,
    clean_result: bool = True,
    offload_buffers: bool = False,
    fallback_allocation: bool = False,
) -> dict[str, DeviceKey]:
    """Fill devices in order (accelerators, cpu, then disk) with the model's modules.

    A module that does not fit is split into its children unless its class is in
    `no_split_module_classes`; tied parameters land on one device; the first accelerator (or the
    cpu) keeps room for the largest layer so offloaded layers can be brought in to run.
    """
    budget = get_max_memory(max_memory)
    ties = find_tied_parameters(model)
    if not ties and check_tied_parameters_in_config(model):
        logger.warning(
            "the config ties weights but the model has none tied: call model.tie_weights() before planning"
        )
    plan = _Plan(
        budget={**budget, "disk": budget.get("disk", 0)},
        devices=[*budget, *(["disk"] if "disk" not in budget else [])],
        sizes=compute_module_sizes(model, dtype, special_dtypes),
        buffer_sizes={}
        if offload_buffers
        else compute_module_sizes(model, dtype, special_dtypes, buffers_only=True),
        no_split=set(no_split_module_classes or []),
        ties=ties,
        pending=[*named_module_tensors(model, recurse=False), *model.named_children()],
        fallback=fallback_allocation,
    )
    while plan.pending:
        _place_next(plan)
    device_map = clean_device_map(plan.device_map) if clean_result else dict(plan.device_map)
    if verbose:
        print(explain_plan(plan, device_map, offload_buffers))
    return device_map


def explain_plan(plan: _Plan, device_map: Mapping[str, DeviceKey], offload_buffers: bool) -> str:
    """Text of what went where: bytes per device, and why each offload or split happened."""
    lines = ["device map plan:"]
    for device in plan.devices:
        limit = "unbounded" if device == "disk" else f"{plan.budget[device]} B"
        lines.append(f"  {device}: {plan.used.get(device, 0)} B used of {limit}")
    offloaded = [
        n
        for n, d in device_map.items()
        if d in ("cpu", "disk") and any(isinstance(k, int) for k in plan.devices)
    ]
    offloaded += [n for n, d in device_map.items() if d == "disk" and n not in offloaded]
    if offloaded:
        lines.append(
            f"  offloaded (run on the main device, weights fetched per forward): {', '.join(offloaded)}"
        )
    if offload_buffers:
        lines.append("  buffers of offloaded modules are offloaded too (offload_buffers=True)")
    lines.extend(f"  {note}" for note in plan.notes)
    return "\n".join(lines)


def clean_device_map(device_map: Mapping[str, DeviceKey], module_name: str = "") -> dict[str, DeviceKey]:
    """Merge entries whose children all share one device into their parent (shorter, same meaning)."""
    items = list(device_map.items())
    inside = [i for i, (k, _) in enumerate(items) if _within(k, module_name)]
    if not inside:
        return dict(items)
    if len(inside) > 1 and len({str(items[i][1]) for i in inside}) == 1:
        merged = (module_name, items[inside[0]][1])
        kept = [kv for i, kv in enumerate(items) if i not in set(inside)]
        kept.insert(inside[0], merged)
        return dict(kept)
    depth = module_name.count(".") + 1 if module_name else 0
    children: list[str] = []
    for i in inside:
        child = ".".join(items[i][0].split(".")[: depth + 1])
        if child != module_name and child not in children:
            children.append(child)
    result = dict(items)
    for child in children:
        result = clean_device_map(result, child)
    return result


def check_device_map(model: nn.Module, device_map: Mapping[str, Any]) -> None:
    """Raise ValueError naming every parameter/buffer that no device-map entry covers."""
    missing = [
        name
        for name, _ in named_module_tensors(model, recurse=True)
        if not any(_within(name, key) for key in device_map)
    ]
    if missing:
        shown = ", ".join(missing[:10]) + (" ..." if len(missing) > 10 else "")
        raise ValueError(f"device_map does not cover {len(missing)} tensor(s) of the model: {shown}")


def check_tied_parameters_on_same_device(
    tied_params: Sequence[Sequence[str]], device_map: Mapping[str, Any]
) -> None:
    """Warn for each tied group whose members the map sends to different devices."""
    for group in tied_params:
        devices = {str(device_for(name, device_map)) for name in group}
        if len(devices) > 1:
            logger.warning(
                "tied parameters %s are mapped to different devices %s", list(group), sorted(devices)
            )


def device_for(name: str, device_map: Mapping[str, Any]) -> Any:
    """Device of a tensor or module name: the entry with the longest matching prefix."""
    best: str | None = None
    for key in device_map:
        if _within(name, key) and (best is None or len(key) > len(best)):
            best = key
    if best is None:
        raise ValueError(f"{name!r} is not covered by the device map (keys: {list(device_map)[:8]} ...)")
    return device_map[best]


def resolve_device_map(
    model: nn.Module,
    device_map: str | Mapping[str, Any] | None,
    max_memory: Mapping[DeviceKey, int | str] | None = None,
    no_split_module_classes: Sequence[str] | None = None,
    dtype: torch.dtype | str | None = None,
    offload_buffers: bool = False,
    verbose: bool = False,
) -> dict[str, Any] | None:
    """Turn "auto"/"balanced"/"balanced_low_0"/"sequential" into a map; dicts pass through checked."""
    if device_map is None or isinstance(device_map, Mapping):
        return None if device_map is None else dict(device_map)
    if device_map not in DEVICE_MAP_STRATEGIES:
        raise ValueError(
            f"device_map={device_map!r} is not accepted; use a dict or one of {DEVICE_MAP_STRATEGIES}"
        )
    no_split = list(no_split_module_classes or [])
    if device_map != "sequential":
        max_memory = get_balanced_memory(
            model, max_memory, no_split, dtype=dtype, low_zero=device_map == "balanced_low_0"
        )
    return infer_auto_device_map(
        model, max_memory, no_split, dtype=dtype, offload_buffers=offload_buffers, verbose=verbose
    )
