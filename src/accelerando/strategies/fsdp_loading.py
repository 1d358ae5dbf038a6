"""`cpu_ram_efficient_loading` and `sync_module_states` for FSDP2.

Rank 0 holds the real weights; every other rank builds its model on the meta device. The model is
sharded while still on meta, each rank allocates only its own shards (`to_empty`), and rank 0's
tensors are broadcast one at a time, each rank keeping its slice. Peak host memory on ranks other
than 0 is therefore their shard plus one full tensor, instead of a whole model per rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist


@dataclass
class Rank0Weights:
    """What rank 0 kept before its model went to meta: the state dict and the non-persistent buffers."""

    state_dict: dict[str, torch.Tensor] = field(default_factory=dict)
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)


def has_meta_tensors(model: torch.nn.Module) -> bool:
    return any(t.is_meta for t in [*model.parameters(), *model.buffers()])


def _non_persistent_buffer_names(model: torch.nn.Module) -> list[str]:
    persistent = set(model.state_dict().keys())
    return [name for name, _ in model.named_buffers() if name not in persistent]


def move_to_meta(model: torch.nn.Module, rank: int) -> Rank0Weights:
    """Keep rank 0's tensors (references, no copy) and free every rank's full-size storage."""
    kept = Rank0Weights()
    if rank == 0:
        if has_meta_tensors(model):
            raise ValueError(
                "cpu_ram_efficient_loading: rank 0 must hold the real weights, but its model has tensors on "
                "the meta device; create the model normally on rank 0 (meta only on the other ranks)"
            )
        kept.state_dict = {k: v.detach() for k, v in model.state_dict().items()}
        buffers = dict(model.named_buffers())
        kept.buffers = {n: buffers[n].detach() for n in _non_persistent_buffer_names(model)}
    model.to("meta")
    return kept


def materialize_from_rank0(model: torch.nn.Module, kept: Rank0Weights, device: torch.device) -> None:
    """After sharding on meta: allocate this rank's shards, then receive rank 0's values."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    model.to_empty(device=device)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    full: dict[str, Any] = dict(kept.state_dict) if dist.get_rank() == 0 else {}
    set_model_state_dict(model, full, options=options)
    buffers = dict(model.named_buffers())
    for name in _non_persistent_buffer_names(model):
        target = buffers[name]
        if dist.get_rank() == 0:
            target.copy_(kept.buffers[name].to(target.device))
        dist.broadcast(target, src=0)
    kept.state_dict.clear()
    kept.buffers.clear()


def broadcast_module_states(model: torch.nn.Module) -> None:
    """`sync_module_states` on a model every rank built for real: rank 0's values win. Tensor-parallel
    shards (DTensors) are skipped: `parallelize_module` scattered them from their group's first rank."""
    from torch.distributed.tensor import DTensor

    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            if isinstance(tensor, DTensor):
                continue
            if tensor.is_meta:
                raise ValueError(
                    "sync_module_states: a parameter is on the meta device; enable cpu_ram_efficient_loading "
                    "so rank 0's weights are loaded into the shards"
                )
            dist.broadcast(tensor.data, src=0)


def describe_memory() -> dict[str, Any]:
    """Peak resident memory of this process so far (Linux reports KiB), for tests and benchmarks."""
    import resource

    return {"max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
