"""The steps `Strategy.prepare_model` composes that do not depend on the strategy.

Device placement, running the forward under the precision's autocast, and pointing optimizers at
the parameters that sharding put in place of the ones they were built with.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from accelerando.ops.tree import convert_to_fp32
from accelerando.precision.base import Precision

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def inner_module(model: torch.nn.Module) -> torch.nn.Module:
    """The module that holds the parameters (a `torch.compile` wrapper keeps it as `_orig_mod`)."""
    return getattr(model, "_orig_mod", model)


def place_on_device(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """Move to `device`, except models dispatched by a device map or still on meta (FSDP loads them)."""
    if getattr(model, "hf_device_map", None) is not None or any(p.is_meta for p in model.parameters()):
        return model
    return model.to(device)


def wrap_forward_in_autocast(model: torch.nn.Module, precision: Precision) -> None:
    """Run `model.forward` under the precision's autocast and return fp32 outputs (Accelerate's contract)."""
    if not precision.wraps_forward or hasattr(model, "_original_forward"):
        return
    original = model.forward

    @functools.wraps(original)
    def forward(*args: Any, **kwargs: Any) -> Any:
        with precision.forward_context(model):
            out = original(*args, **kwargs)
        if isinstance(out, torch.Tensor):  # the common case, without walking a structure
            return out.float() if out.dtype in _LOW_PRECISION else out
        return convert_to_fp32(out)

    model._original_forward = original  # type: ignore[assignment]
    model.forward = forward  # type: ignore[method-assign]


def restore_forward(model: torch.nn.Module) -> None:
    """Undo `wrap_forward_in_autocast` (`unwrap_model(keep_fp32_wrapper=False)`)."""
    original = model.__dict__.pop("_original_forward", None)
    if original is not None:
        model.__dict__.pop("forward", None)
        if getattr(model.forward, "__func__", None) is not getattr(original, "__func__", None):
            model.forward = original  # type: ignore[method-assign]


def refuse_multi_device_map(model: torch.nn.Module) -> None:
    """A model spread over several devices by a device map cannot be replicated per process."""
    device_map = getattr(model, "hf_device_map", None)
    if isinstance(device_map, dict) and len(set(device_map.values())) > 1:
        raise ValueError(
            "this model was dispatched over several devices (hf_device_map "
            f"{sorted(set(map(str, device_map.values())))}); it cannot be trained with data parallelism. "
            "Load it on one device per process, or use FSDP."
        )


ParameterNames = dict[int, tuple[int, str]]


def parameter_names(models: list[torch.nn.Module]) -> ParameterNames:
    """id(parameter) -> (model index, name), recorded before anything replaces the parameters."""
    names: ParameterNames = {}
    for index, model in enumerate(models):
        for name, param in inner_module(model).named_parameters():
            names.setdefault(id(param), (index, name))
    return names


def raw_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    return getattr(optimizer, "optimizer", optimizer)


def rebind_optimizer(
    optimizer: torch.optim.Optimizer, names: ParameterNames, models: list[torch.nn.Module]
) -> None:
    """Point each param group at the parameter that replaced the one it held (same name)."""
    optimizer = raw_optimizer(optimizer)
    if optimizer.state:
        raise ValueError(
            "this optimizer already stepped (it has state for the unsharded parameters); pass it to "
            "prepare() before the first optimizer.step()"
        )
    current = [dict(inner_module(m).named_parameters()) for m in models]
    for group in optimizer.param_groups:
        rebound = []
        for param in group["params"]:
            key = names.get(id(param))
            rebound.append(current[key[0]][key[1]] if key is not None else param)
        group["params"] = rebound


def follow_replaced_optimizers(schedulers: Any, before: list[Any], after: list[Any]) -> None:
    """Schedulers of an optimizer a precision replaced (MS-AMP's) drive the replacement."""
    for old, new in zip(before, after):
        if new is not old:
            for scheduler in schedulers:
                if getattr(scheduler, "optimizer", None) is old:
                    scheduler.optimizer = new
                    _track_step_for_scheduler(new)


def _track_step_for_scheduler(optimizer: Any) -> None:
    """What torch's LRScheduler does to the optimizer it is built with, for its "optimizer.step()
    before lr_scheduler.step()" check: mark the step as tracked and note each call."""
    step = optimizer.step
    if getattr(step, "_wrapped_by_lr_sched", False):
        return

    @functools.wraps(step)
    def tracked(*args: Any, **kwargs: Any) -> Any:
        optimizer._opt_called = True
        return step(*args, **kwargs)

    tracked._wrapped_by_lr_sched = True  # type: ignore[attr-defined]
    optimizer.step = tracked
