"""State dicts of models whose parameters are DTensors (FSDP2 shards, tensor-parallel shards), through
torch's `torch.distributed.checkpoint.state_dict` API. `full=True` gathers each tensor onto rank 0's
CPU (others get `{}`) and loading broadcasts rank 0's copy; `full=False` keeps this rank's shards for
DCP, which reshards on load. `distributed=False` (one plain process, nothing sharded) passes only
`strict` to torch."""

from __future__ import annotations

from typing import Any

import torch


def _options(full: bool, distributed: bool, **extra: Any) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    if not distributed:
        return StateDictOptions(**{k: v for k, v in extra.items() if k == "strict"})
    if full:
        extra.setdefault("cpu_offload", True)
    return StateDictOptions(full_state_dict=full, **extra)


def model_state_dict(model: torch.nn.Module, full: bool, distributed: bool = True) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=_options(full, distributed))


def load_model_state_dict(
    model: torch.nn.Module, state_dict: dict[str, Any], full: bool, strict: bool, distributed: bool = True
) -> Any:
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    extra: dict[str, Any] = {"strict": strict}
    if full and distributed:
        extra.update(broadcast_from_rank0=True, cpu_offload=False)
    # torch fills the dict it is given with shards: copy so the caller's dict stays as it was.
    return set_model_state_dict(model, dict(state_dict), options=_options(full, distributed, **extra))


def optimizer_state_dict(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, full: bool, distributed: bool = True
) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=_options(full, distributed))


def load_optimizer_state_dict(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    state_dict: dict[str, Any],
    full: bool,
    distributed: bool = True,
) -> None:
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    extra: dict[str, Any] = (
        {"broadcast_from_rank0": True, "cpu_offload": False} if full and distributed else {}
    )
    options = _options(full, distributed, **extra)
    set_optimizer_state_dict(model, optimizer, _copy_containers(state_dict), options=options)


def _copy_containers(obj: Any) -> Any:
    """New dicts and lists all the way down, the same tensors inside (torch fills what it is given)."""
    if isinstance(obj, dict):
        return {k: _copy_containers(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_copy_containers(v) for v in obj]
    return obj
