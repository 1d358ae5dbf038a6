"""Device-map planning: pure functions of (module tree, memory budget) -> {module name: device}.

Same inputs give the same map; nothing here touches a device except `get_max_memory()` when it is
asked to measure the machine (pass `max_memory` to keep it pure). The fill follows Accelerate's
rules step for step, so a model planned here lands where Accelerate would put it; the deliberate
differences are listed in docs/migration.md.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from accelerando.big_model.budget import DeviceKey, get_balanced_memory, get_max_memory
from accelerando.big_model.sizes import (
    check_tied_parameters_in_config,
    compute_module_sizes,
    find_tied_parameters,
    get_max_layer_size,
    named_module_tensors,
    split_entries,
    top_level_entries,
)

logger = logging.getLogger(__name__)

DEVICE_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")
Entry = tuple[str, nn.Module | torch.Tensor]


@dataclass
class _Plan:
    """State of one planning pass: the queue of entries still to place and what each device holds."""

    budget: dict[DeviceKey, float]
    sizes: Mapping[str, float]
    buffer_sizes: Mapping[str, float]
    no_split: list[str]
    ties: list[list[str]]
    queue: list[Entry]
    fallback: bool
    offload_buffers: bool
    devices: list[DeviceKey] = field(default_factory=list)
    index: int = 0
    largest: float = 0
    largest_names: list[str] = field(default_factory=list)
    used: dict[DeviceKey, float] = field(default_factory=dict)
    resident_buffers: dict[DeviceKey, float] = field(default_factory=dict)
    minimum: dict[DeviceKey, float] = field(default_factory=dict)
    device_map: dict[str, DeviceKey] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.devices = [*self.budget, *(["disk"] if "disk" not in self.budget else [])]
        self.used = dict.fromkeys(self.devices, 0)
        self.largest, self.largest_names = get_max_layer_size(self.queue, self.sizes, self.no_split)

    @property
    def device(self) -> DeviceKey:
        return self.devices[self.index]

    @property
    def main_devices(self) -> list[DeviceKey]:
        """Devices that run offloaded layers, so keep room for the largest one: first accelerator and cpu."""
        accel = [d for d in self.devices if d not in ("cpu", "disk")]
        if "mps" in accel:
            return ["mps"]
        return [accel[0], "cpu"] if accel else ["cpu"]

    def refresh_largest(self) -> None:
        modules = [(n, m) for n, m in self.queue if isinstance(m, nn.Module)]
        self.largest, self.largest_names = get_max_layer_size(modules, self.sizes, self.no_split)

    def splittable(self, entry: nn.Module | torch.Tensor) -> bool:
        return (
            isinstance(entry, nn.Module)
            and next(entry.children(), None) is not None
            and type(entry).__name__ not in self.no_split
        )


def _within(tensor_name: str, prefix: str) -> bool:
    return prefix == "" or tensor_name == prefix or tensor_name.startswith(prefix + ".")


def tied_outside(ties: Sequence[Sequence[str]], name: str) -> list[str]:
    """Parameters outside `name` tied to one inside it (they must land on the same device)."""
    outside: list[str] = []
    for group in ties:
        inside = [t for t in group if _within(t, name)]
        if inside and len(inside) < len(group):
            outside += [t for t in group if not _within(t, name)]
    return outside


def tie_owners(tied_params: Sequence[str], entries: Sequence[Entry]) -> list[Entry | None]:
    """For each tied parameter, the first entry that holds it (None when no entry does)."""
    return [next(((n, m) for n, m in entries if _within(p, n) and n), None) for p in tied_params]


def size_with_ties(
    tied_params: Sequence[str], size: float, sizes: Mapping[str, float], owners: Sequence[Entry | None]
) -> float:
    """`size` plus each owner of a tied parameter, less the tied parameter itself (counted once)."""
    extra = sum(sizes[o[0]] - sizes[p] for p, o in zip(tied_params, owners) if o is not None)
    return size + extra


def _step(plan: _Plan) -> None:
    """Place the first queued entry (with its tied partners), split it, or move on to the next device."""
    name, entry = plan.queue.pop(0)
    plan.largest_names = [n for n in plan.largest_names if not _within(n, name)]
    if not plan.largest_names:
        plan.refresh_largest()
    size = plan.sizes[name]
    outside = tied_outside(plan.ties, name)
    owners = tie_owners(outside, plan.queue)
    partners = [o for o in owners if o is not None]
    total = size_with_ties(outside, size, plan.sizes, owners)
    device = plan.device
    reserved = plan.largest if device in plan.main_devices else 0
    room = None if device == "disk" else plan.budget[device] - reserved - plan.used[device]
    if room is None or total <= room:
        _assign(plan, name, entry, partners, device, total)
        return
    if outside and size <= room and _split_partner(plan, name, entry, partners):
        return
    if size >= room and plan.splittable(entry):
        plan.notes.append(
            f"{name} ({size} B) does not fit in {room} B left on {device}: split into its children"
        )
        plan.queue = split_entries(name, entry) + plan.queue  # type: ignore[arg-type]
        plan.refresh_largest()
        return
    if plan.used[device] == 0 and plan.fallback and device != "disk" and _fallback(plan, name, entry, total):
        return
    if plan.used[device] == 0:
        plan.minimum[device] = total + reserved
    kept = f" after keeping {reserved} B to run offloaded layers" if reserved else ""
    plan.notes.append(f"{name} ({total} B) does not fit in {room} B left on {device}{kept}: next device")
    plan.used[device] += reserved
    plan.index += 1
    plan.queue.insert(0, (name, entry))


def _assign(
    plan: _Plan,
    name: str,
    entry: nn.Module | torch.Tensor,
    partners: list[Entry],
    device: DeviceKey,
    total: float,
) -> None:
    plan.used[device] += total
    plan.device_map[name] = device
    for other, _ in partners:
        position = next((i for i, (n, _) in enumerate(plan.queue) if n == other), None)
        if position is not None:
            plan.queue.pop(position)
        plan.device_map[other] = device
        plan.notes.append(f"{other} -> {device}: tied to a parameter in {name}")
    if not plan.offload_buffers and isinstance(entry, nn.Module):
        plan.resident_buffers[device] = plan.resident_buffers.get(device, 0) + plan.buffer_sizes.get(name, 0)


def _split_partner(plan: _Plan, name: str, entry: nn.Module | torch.Tensor, partners: list[Entry]) -> bool:
    """`name` fits alone but not with its tied partners: split the first partner that can be split."""
    for other, module in partners:
        if not plan.splittable(module):
            continue
        position = next(i for i, (n, _) in enumerate(plan.queue) if n == other)
        pieces = split_entries(other, module)  # type: ignore[arg-type]
        plan.queue = [(name, entry), *plan.queue[:position], *pieces, *plan.queue[position + 1 :]]
        plan.refresh_largest()
        plan.notes.append(f"{other} split so that the part tied to {name} can join it on {plan.device}")
        return True
    return False


def _fallback(plan: _Plan, name: str, entry: nn.Module | torch.Tensor, total: float) -> bool:
    """Before leaving a device that got nothing, put on it the first later entry that fits (breadth first)."""
    device = plan.device
    room = plan.budget[device] - max(plan.largest, total)
    if room < 0:
        return False
    found = _search_fitting(plan, room)
    if found is None:
        return False
    _expand_to(plan, found)
    plan.queue = [found, (name, entry), *(e for e in plan.queue if e[0] != found[0])]
    plan.notes.append(f"{found[0]} -> {device}: fallback allocation, {name} ({total} B) was too big")
    return True


def _search_fitting(plan: _Plan, room: float) -> Entry | None:
    """The first queued entry, or piece of one, that fits in `room` with its tied partners."""
    search = list(plan.queue)
    while search:
        name, entry = search.pop(0)
        outside = tied_outside(plan.ties, name)
        owners = tie_owners(outside, search)
        # a partner already out of the search list cannot come along: treat the entry as too big
        fits = None not in owners and size_with_ties(outside, plan.sizes[name], plan.sizes, owners) <= room
        if fits:
            return name, entry
        if plan.splittable(entry):
            search = split_entries(name, entry) + search  # type: ignore[arg-type]
    return None


def _expand_to(plan: _Plan, found: Entry) -> None:
    """Split the queued ancestors of `found` so that it becomes an entry of the queue itself."""
    name = found[0]
    for cut in (i for i, c in enumerate(name) if c == "."):
        parent = name[:cut]
        position = next((i for i, (n, _) in enumerate(plan.queue) if n == parent), None)
        if position is not None:
            pieces = split_entries(parent, plan.queue[position][1])  # type: ignore[arg-type]
            plan.queue[position : position + 1] = pieces


def infer_auto_device_map(
    model: nn.Module,
    max_memory: Mapping[DeviceKey, float | str] | None = None,
    no_split_module_classes: Sequence[str] | str | None = None,
    dtype: torch.dtype | str | None = None,
    special_dtypes: Mapping[str, torch.dtype | str] | None = None,
    verbose: bool = False,
    clean_result: bool = True,
    offload_buffers: bool = False,
    fallback_allocation: bool = False,
) -> dict[str, DeviceKey]:
    """Fill devices in order (accelerators, cpu, then disk) with the model's modules.

    The model's own parameters come first, then its children, then its own buffers. A module that
    does not fit is split into its children unless its class is in `no_split_module_classes`; tied
    parameters land on one device; the first accelerator and the cpu keep room for the largest
    remaining layer so offloaded layers can be brought in to run. With `fallback_allocation`, a
    device that would get nothing first takes the first later module that fits on it.
    """
    no_split = (
        [no_split_module_classes] if isinstance(no_split_module_classes, str) else no_split_module_classes
    )
    budget: dict[DeviceKey, float] = dict(get_max_memory(max_memory))
    ties = find_tied_parameters(model)
    if not ties and check_tied_parameters_in_config(model):
        logger.warning(
            "The model weights are not tied. Please use the `tie_weights` method before using the "
            "`infer_auto_device` function (the config ties them, the model has none tied)."
        )
    plan = _Plan(
        budget=budget,
        sizes=compute_module_sizes(model, dtype, special_dtypes),
        buffer_sizes=compute_module_sizes(model, dtype, special_dtypes, buffers_only=True),
        no_split=list(no_split or []),
        ties=ties,
        queue=top_level_entries(model),
        fallback=fallback_allocation,
        offload_buffers=offload_buffers,
    )
    while plan.queue:
        _step(plan)
    device_map = clean_device_map(plan.device_map) if clean_result else dict(plan.device_map)
    _warn_buffers_not_fitting(plan)
    _log_empty_devices(plan)
    if verbose:
        print(explain_plan(plan, device_map, offload_buffers))
    return device_map


def _warn_buffers_not_fitting(plan: _Plan) -> None:
    """Buffers of offloaded modules stay on an accelerator: warn when no accelerator has room for them."""
    offloaded = plan.resident_buffers.get("cpu", 0) + plan.resident_buffers.get("disk", 0)
    accelerators = [d for d in plan.budget if d not in ("cpu", "disk")]
    if offloaded <= 0 or plan.offload_buffers or not accelerators:
        return
    if any(plan.budget[d] >= offloaded + plan.used.get(d, 0) for d in accelerators):
        return
    budgets = {d: plan.budget[d] for d in accelerators}
    planned = {d: plan.used[d] for d in accelerators}
    warnings.warn(
        f"Current model requires {offloaded} bytes of buffer for offloaded layers, which seems does not fit any "
        "GPU's remaining memory. If you are experiencing a OOM later, please consider using offload_buffers=True. "
        f"(The buffers of modules offloaded to cpu/disk stay on the accelerator; budgets {budgets}, "
        f"already planned {planned}.)",
        stacklevel=3,
    )


def _log_empty_devices(plan: _Plan) -> None:
    if not plan.minimum:
        return
    lines = "\n".join(f"  - {device}: {size} bytes required" for device, size in plan.minimum.items())
    logger.info(
        "Based on the current allocation process, no modules could be assigned to the following devices due to "
        f"insufficient memory:\n{lines}\nThese minimum requirements are specific to this allocation attempt and "
        "may vary. Consider increasing the available memory for these devices to at least the specified minimum, "
        "or adjusting the model config."
    )


def explain_plan(plan: _Plan, device_map: Mapping[str, DeviceKey], offload_buffers: bool) -> str:
    """Text of what went where: bytes per device, and why each offload or split happened."""
    lines = ["device map plan:"]
    for device in plan.devices:
        limit = "unbounded" if device == "disk" else f"{plan.budget[device]} B"
        lines.append(
            f"  {device}: {plan.used.get(device, 0)} B planned (with room kept to run offloads) of {limit}"
        )
    offloaded = [
        n
        for n, d in device_map.items()
        if d in ("cpu", "disk") and any(isinstance(k, int) for k in plan.devices)
    ]
    offloaded += [n for n, d in device_map.items() if d == "disk" and n not in offloaded]
    if offloaded:
        lines.append(
            "  offloaded (run on the main device, weights fetched per forward): "
            + ", ".join(n or "(the whole model)" for n in offloaded)
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
    """Warn for keys naming nothing in the model; raise naming every tensor that no entry covers.

    A key may name a module or a tensor (the planner maps a model's own parameters and buffers by
    name), so only names that are neither are reported.
    """
    known = {name for name, _ in model.named_modules()}
    known.update(name for name, _ in named_module_tensors(model, recurse=True))
    invalid = [key for key in device_map if key != "" and key not in known]
    if invalid:
        warnings.warn(
            f"The following device_map keys do not match any submodules in the model: {invalid} "
            "(they name no module, parameter or buffer of the model, so they place nothing)",
            UserWarning,
            stacklevel=2,
        )
    missing = [
        name
        for name, _ in named_module_tensors(model, recurse=True)
        if not any(_within(name, key) for key in device_map)
    ]
    if missing:
        shown = ", ".join(missing[:10]) + (" ..." if len(missing) > 10 else "")
        raise ValueError(
            f"The device_map provided does not give any device for the following parameters: {shown} "
            f"({len(missing)} tensor(s) of the model are not covered; map them or one of their modules)"
        )


def check_tied_parameters_on_same_device(
    tied_params: Sequence[Sequence[str]], device_map: Mapping[str, Any]
) -> None:
    """Warn for each tied group whose members the map sends to different devices."""
    for group in tied_params:
        devices = {name: device_for(name, device_map) for name in group}
        if len({str(d) for d in devices.values()}) > 1:
            logger.warning(
                f"Tied parameters are on different devices: {devices}. Please modify your custom device map or "
                "set `device_map='auto'`. (A tied weight is one tensor: it can live on one device only.)"
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
    max_memory: Mapping[DeviceKey, float | str] | None = None,
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
