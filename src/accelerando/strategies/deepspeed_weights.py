"""Whole weights in and out of DeepSpeed engines, and the partitions of engines without optimizer.

ZeRO-3 keeps 1/world of each parameter per rank; whole tensors are gathered one module at a time
(`zero.GatheredParameters`), so no rank ever holds more than one module's weights beyond what it
keeps, and only rank 0 copies them to CPU. ZeRO 0-2 keep whole parameters on every rank.
"""

from __future__ import annotations

from typing import Any

import torch


def _gathered(params: list[torch.nn.Parameter], modifier_rank: int | None = None) -> Any:
    import deepspeed

    return deepspeed.zero.GatheredParameters(params, modifier_rank=modifier_rank)


def _partition(param: torch.nn.Parameter) -> torch.Tensor:
    """This rank's ZeRO-3 partition of `param` (DeepSpeed's attribute)."""
    return param.ds_tensor  # type: ignore[attr-defined,no-any-return]


def full_state_dict(module: torch.nn.Module, *, zero3: bool, rank: int) -> dict[str, Any]:
    """The module's state dict as whole CPU tensors on rank 0 ({} elsewhere); collective under ZeRO-3."""
    keys = list(module.state_dict().keys())  # persistent names, in order (ZeRO-3: empty placeholders)
    out: dict[str, torch.Tensor] = {}
    if not zero3:
        if rank == 0:
            out = {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}
        return out
    for prefix, sub in module.named_modules(remove_duplicate=False):
        own = list(sub.named_parameters(recurse=False))
        if not own:
            continue
        with _gathered([p for _, p in own]):
            if rank == 0:
                for name, param in own:
                    out[f"{prefix}.{name}" if prefix else name] = param.detach().cpu().clone()
    if rank != 0:
        return {}
    buffers = {k: v for k, v in module.state_dict().items() if k not in out}
    out.update({k: v.detach().cpu().clone() for k, v in buffers.items()})
    return {k: out[k] for k in keys if k in out}


def load_full_state_dict(engine: Any, state_dict: dict[str, Any], *, strict: bool, rank: int) -> None:
    """Rank 0's whole tensors into every rank's engine (ZeRO-3: scattered into the partitions), then
    into the optimizer's fp32 master copies so the next step starts from them. Collective."""
    import torch.distributed as dist

    module: torch.nn.Module = engine.module
    problems: list[str | None] = [None]
    if rank == 0:
        expected = set(module.state_dict().keys())
        missing = sorted(expected - set(state_dict))
        unexpected = sorted(set(state_dict) - expected)
        if strict and (missing or unexpected):
            problems = [
                f"missing {missing[:3]} ({len(missing)}), unexpected {unexpected[:3]} ({len(unexpected)})"
            ]
    dist.broadcast_object_list(problems, src=0)  # every rank raises together, none waits alone
    if problems[0] is not None:
        raise ValueError(f"the state dict does not fit the model: {problems[0]}")
    with torch.no_grad():
        if engine.zero_optimization_stage() == 3:
            for prefix, sub in module.named_modules():
                own = list(sub.named_parameters(recurse=False))
                if own:
                    with _gathered([p for _, p in own], modifier_rank=0):
                        if rank == 0:
                            _copy_into(own, prefix, state_dict)
            targets = dict(module.named_buffers())
        else:
            targets = dict(module.state_dict(keep_vars=True))
            if rank == 0:
                _copy_into(list(targets.items()), "", state_dict)
        for tensor in targets.values():
            dist.broadcast(tensor.data, src=0)
    refresh = getattr(engine.optimizer, "refresh_fp32_params", None)
    if callable(refresh):
        refresh()


def _copy_into(named: list[tuple[str, torch.Tensor]], prefix: str, state_dict: dict[str, Any]) -> None:
    for name, tensor in named:
        key = f"{prefix}.{name}" if prefix else name
        if key in state_dict:
            tensor.data.copy_(state_dict[key].to(tensor.dtype))


def partition_state(engine: Any) -> dict[str, torch.Tensor]:
    """What this rank keeps of an engine without optimizer: its ZeRO-3 partitions, or whole tensors."""
    module: torch.nn.Module = engine.module
    if engine.zero_optimization_stage() == 3:
        out = {n: _partition(p).detach().cpu().clone() for n, p in module.named_parameters()}
        params = {n for n, _ in module.named_parameters(remove_duplicate=False)}
        out.update({k: v.detach().cpu().clone() for k, v in module.state_dict().items() if k not in params})
        return out
    return {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}


def load_partition_state(engine: Any, state: dict[str, torch.Tensor]) -> None:
    """Inverse of `partition_state`, for the same number of ranks."""
    module: torch.nn.Module = engine.module
    if engine.zero_optimization_stage() != 3:
        module.load_state_dict(state)
        return
    params = dict(module.named_parameters())
    with torch.no_grad():
        for name, param in params.items():
            _partition(param).copy_(state[name])
        for name, buffer in module.named_buffers():
            if name in state:
                buffer.copy_(state[name])


def check_partition_state(engine: Any, state: dict[str, torch.Tensor], name: str) -> list[str]:
    """Problems (missing names, wrong shapes) of a saved partition against the live engine."""
    expected = partition_state_shapes(engine)
    problems = [f"{name}: missing {k!r}" for k in expected if k not in state]
    problems += [
        f"{name}: {k!r} has shape {tuple(state[k].shape)}, the engine keeps {shape}"
        for k, shape in expected.items()
        if k in state and tuple(state[k].shape) != shape
    ]
    return problems[:5]


def partition_state_shapes(engine: Any) -> dict[str, tuple[int, ...]]:
    module: torch.nn.Module = engine.module
    zero3 = engine.zero_optimization_stage() == 3
    shapes = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    if zero3:
        for name in {n for n, _ in module.named_parameters(remove_duplicate=False)}:
            shapes.pop(name, None)
        shapes.update({n: tuple(_partition(p).shape) for n, p in module.named_parameters()})
    return shapes
