"""Which submodules become their own FSDP2 unit: pure functions of the model and the plugin.

Each unit all-gathers its parameters just before its forward and frees them after, so peak memory
is about one unit's full parameters plus every rank's shards. The root is always sharded last and
holds whatever no unit claimed (embeddings, final norm, heads).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import torch

from accelerando.config.fsdp import FullyShardedDataParallelPlugin


@dataclass(frozen=True)
class WrapPlan:
    """The units to shard (children before parents, root excluded) and why they were chosen."""

    modules: list[torch.nn.Module]
    policy: str
    reason: str
    classes: tuple[str, ...] = ()  # the units' class names, recorded before sharding renames them


def _plan(modules: list[torch.nn.Module], policy: str, reason: str) -> WrapPlan:
    return WrapPlan(modules, policy, reason, tuple(type(m).__name__ for m in modules))


def _no_split_names(model: torch.nn.Module) -> list[str]:
    """transformers models name their indivisible blocks in `_no_split_modules` (on any submodule)."""
    names: list[str] = []
    for module in model.modules():
        for name in getattr(module, "_no_split_modules", None) or []:
            if name not in names:
                names.append(name)
    present = {type(m).__name__ for m in model.modules()}
    return [n for n in names if n in present]


def _repeated_block_names(model: torch.nn.Module) -> list[str]:
    """The class repeated most often inside a ModuleList/Sequential (the model's layer stack)."""
    counts: Counter[str] = Counter()
    for module in model.modules():
        if isinstance(module, (torch.nn.ModuleList, torch.nn.Sequential)):
            kinds = Counter(type(child).__name__ for child in module.children() if _numel(child) > 0)
            for name, count in kinds.items():
                if count >= 2:
                    counts[name] += count
    if not counts:
        return []
    best = max(counts.values())
    return sorted(name for name, count in counts.items() if count == best)


def infer_block_classes(model: torch.nn.Module) -> tuple[list[str], str]:
    """Class names to wrap when none are given, and where they came from."""
    names = _no_split_names(model)
    if names:
        return names, "the model's _no_split_modules"
    names = _repeated_block_names(model)
    if names:
        return names, "the model's repeated blocks"
    return [], "no repeated blocks found"


def post_order(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Children before parents and siblings in definition (usually execution) order; root excluded."""
    out: list[torch.nn.Module] = []

    def visit(module: torch.nn.Module) -> None:
        for child in module.children():
            visit(child)
            out.append(child)

    visit(model)
    return list(dict.fromkeys(out))  # a module registered twice is one unit


def outermost(units: list[torch.nn.Module]) -> list[torch.nn.Module]:
    """Units not nested inside another unit, in order: the chain that forward prefetching follows."""
    inner = {id(m) for unit in units for m in unit.modules() if m is not unit}
    return [u for u in units if id(u) not in inner]


def _numel(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _by_class(model: torch.nn.Module, names: list[str]) -> list[torch.nn.Module]:
    present = {type(m).__name__ for m in model.modules()}
    missing = [n for n in names if n not in present]
    if missing:
        raise ValueError(
            f"transformer_cls_names_to_wrap names {missing}, which this model does not contain; "
            f"its module classes are {sorted(present)}"
        )
    wanted = set(names)
    return [m for m in post_order(model) if type(m).__name__ in wanted]


def _by_size(model: torch.nn.Module, min_num_params: int) -> list[torch.nn.Module]:
    """FSDP1's size rule: a module becomes a unit when the parameters not yet claimed below it reach the bound."""
    chosen: list[torch.nn.Module] = []

    def visit(module: torch.nn.Module) -> int:
        remaining = sum(p.numel() for p in module.parameters(recurse=False))
        for child in module.children():
            remaining += visit(child)
        if module is not model and remaining >= min_num_params and remaining > 0:
            chosen.append(module)
            return 0
        return remaining

    visit(model)
    return chosen


def _by_callable(model: torch.nn.Module, policy: Callable[..., bool]) -> list[torch.nn.Module]:
    """A user function `policy(module) -> bool`, or FSDP1's `(module, recurse, nonwrapped_numel)` form."""
    chosen = []
    for module in post_order(model):
        try:
            take = policy(module, recurse=False, nonwrapped_numel=_numel(module))
        except TypeError:
            take = policy(module)
        if take:
            chosen.append(module)
    return chosen


def plan_wrapping(model: torch.nn.Module, plugin: FullyShardedDataParallelPlugin) -> WrapPlan:
    """Units for `model` under the plugin's policy; with no policy, transformer blocks are inferred."""
    policy = plugin.auto_wrap_policy
    if callable(policy):
        return _plan(_by_callable(model, policy), "callable", "the given auto_wrap_policy")
    if policy == "no_wrap":
        return _plan([], "no_wrap", "auto_wrap_policy=no_wrap: the root is the only unit")
    if policy == "size_based_wrap":
        bound = plugin.min_num_params if plugin.min_num_params is not None else 100_000_000
        return _plan(_by_size(model, bound), "size_based_wrap", f"min_num_params={bound}")
    names = list(plugin.transformer_cls_names_to_wrap or [])
    if names:
        return _plan(_by_class(model, names), "transformer_based_wrap", f"classes {names} as given")
    names, source = infer_block_classes(model)
    if not names:
        return _plan([], "transformer_based_wrap", f"{source}: the root is the only unit")
    return _plan(_by_class(model, names), "transformer_based_wrap", f"classes {names} from {source}")
