"""State dicts of models whose parameters are DTensors (tensor parallel), through torch's
`torch.distributed.checkpoint.state_dict` API: `full=True` gathers each tensor onto rank 0's CPU
(others get `{}`), `full=False` keeps this rank's shards for DCP, which reshards on load."""

from __future__ import annotations

from typing import Any

import torch


def _options(full: bool, **extra: Any) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    if full:
        extra.setdefault("cpu_offload", True)
    return StateDictOptions(full_state_dict=full, **extra)


def model_state_dict(model: torch.nn.Module, full: bool) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=_options(full))


def load_model_state_dict(
    model: torch.nn.Module, state_dict: dict[str, Any], full: bool, strict: bool
) -> Any:
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    extra: dict[str, Any] = {"strict": strict}
    if full:
        extra.update(broadcast_from_rank0=True, cpu_offload=False)
    return set_model_state_dict(model, dict(state_dict), options=_options(full, **extra))


def optimizer_state_dict(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, full: bool
) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=_options(full))


def load_optimizer_state_dict(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, state_dict: dict[str, Any], full: bool
) -> None:
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    extra: dict[str, Any] = {"broadcast_from_rank0": True, "cpu_offload": False} if full else {}
    set_optimizer_state_dict(model, optimizer, state_dict, options=_options(full, **extra))
