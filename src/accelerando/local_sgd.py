"""`LocalSGD`: each rank steps on its own gradients; parameters are averaged every `local_sgd_steps`.

Gradient all-reduce is switched off inside the context (the strategy's `no_sync`), so a step costs
no communication; every `local_sgd_steps` optimizer steps (and on leaving the context) the
parameters are averaged over the data-parallel ranks with one all-reduce per dtype. Sharded
strategies (FSDP2, DeepSpeed) keep no full local copy to average, so they are refused.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from accelerando.config.options import DistributedType
from accelerando.ops.collectives import data_parallel_group

if TYPE_CHECKING:
    from accelerando.accelerator import Accelerator

_SHARDED = (DistributedType.FSDP, DistributedType.DEEPSPEED, DistributedType.MEGATRON_LM)


class LocalSGD:
    """`with LocalSGD(accelerator, model, local_sgd_steps=8) as local_sgd:` ... `local_sgd.step()`."""

    def __init__(
        self, accelerator: Accelerator, model: torch.nn.Module, local_sgd_steps: int, enabled: bool = True
    ):
        if accelerator.distributed_type in _SHARDED:
            raise NotImplementedError(
                f"LocalSGD averages full local parameters; {accelerator.distributed_type} shards them. "
                "Use it with DDP or a single process."
            )
        if not isinstance(local_sgd_steps, int) or local_sgd_steps < 1:
            raise ValueError(f"local_sgd_steps must be an integer >= 1, got {local_sgd_steps!r}")
        self.enabled = enabled and accelerator.num_processes > 1
        self.num_steps = 0
        self.accelerator = accelerator
        self.model = model
        self.local_sgd_steps = local_sgd_steps
        self._no_sync: contextlib.AbstractContextManager[Any] | None = None

    def __enter__(self) -> LocalSGD:
        if self.enabled:
            self._no_sync = self.accelerator.no_sync(self.model)
            self._no_sync.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.enabled and self._no_sync is not None:
            if exc[0] is None:  # on an error, do not start a collective the other ranks may never join
                self._sync_and_avg_model_params()
            self._no_sync.__exit__(*exc)
            self._no_sync = None

    def step(self) -> None:
        """Count one optimizer step; average the parameters every `local_sgd_steps`."""
        self.num_steps += 1
        if self.enabled and self.num_steps % self.local_sgd_steps == 0:
            self._sync_and_avg_model_params()

    @torch.no_grad()
    def _sync_and_avg_model_params(self) -> None:
        group = data_parallel_group()
        world = dist.get_world_size(group)
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for p in self.model.parameters():
            by_dtype.setdefault(p.dtype, []).append(p)
        for params in by_dtype.values():
            flat = torch.cat([p.detach().reshape(-1) for p in params])
            dist.all_reduce(flat, group=group)
            flat /= world
            offset = 0
            for tensor in params:
                tensor.copy_(flat[offset : offset + tensor.numel()].view_as(tensor))
                offset += tensor.numel()
