"""Data parallel through `torch.nn.parallel.DistributedDataParallel` (gloo on CPU, nccl on CUDA)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from accelerando.config.options import (
    DDPCommunicationHookType,
    DistributedDataParallelKwargs,
    DistributedType,
)
from accelerando.strategies.base import Strategy, StrategyContext

_MULTI = {
    "cpu": DistributedType.MULTI_CPU,
    "cuda": DistributedType.MULTI_GPU,
    "xpu": DistributedType.MULTI_XPU,
    "npu": DistributedType.MULTI_NPU,
    "mlu": DistributedType.MULTI_MLU,
}


class DDPStrategy(Strategy):
    name = "ddp"

    def __init__(self, ctx: StrategyContext, ddp_kwargs: DistributedDataParallelKwargs | None = None) -> None:
        super().__init__(ctx)
        self.ddp_kwargs = ddp_kwargs or DistributedDataParallelKwargs()

    @property
    def distributed_type(self) -> DistributedType:
        return _MULTI.get(self.ctx.device.type, DistributedType.MULTI_GPU)

    def wrap_model(self, model: torch.nn.Module, *, evaluation_mode: bool = False) -> torch.nn.Module:
        if evaluation_mode or not any(p.requires_grad for p in model.parameters()):
            return model  # nothing to synchronise: inference models stay unwrapped
        device_ids = None if self.ctx.device.type == "cpu" else [self.ctx.device.index or 0]
        wrapped = DistributedDataParallel(model, device_ids=device_ids, **self._ddp_arguments())
        self._register_comm_hook(wrapped)
        return wrapped

    def _ddp_arguments(self) -> dict[str, Any]:
        """Only what the user changed: torch 2.13 deprecates passing `broadcast_buffers` at all."""
        changed = self.ddp_kwargs.to_kwargs()
        for key in ("comm_hook", "comm_wrapper", "comm_state_option", "check_reduction"):
            changed.pop(key, None)
        return changed

    def _register_comm_hook(self, model: DistributedDataParallel) -> None:
        hook_type = DDPCommunicationHookType(self.ddp_kwargs.comm_hook)
        if hook_type == DDPCommunicationHookType.NO:
            return
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

        if hook_type in (DDPCommunicationHookType.POWER_SGD, DDPCommunicationHookType.BATCHED_POWER_SGD):
            state: Any = powerSGD_hook.PowerSGDState(process_group=None, **self.ddp_kwargs.comm_state_option)
            fn: Any = (
                powerSGD_hook.powerSGD_hook
                if hook_type == DDPCommunicationHookType.POWER_SGD
                else powerSGD_hook.batched_powerSGD_hook
            )
            wrapper = DDPCommunicationHookType(self.ddp_kwargs.comm_wrapper)
            if wrapper == DDPCommunicationHookType.FP16:
                fn = default_hooks.fp16_compress_wrapper(fn)
            elif wrapper == DDPCommunicationHookType.BF16:
                fn = default_hooks.bf16_compress_wrapper(fn)
            model.register_comm_hook(state, fn)
            return
        fn = (
            default_hooks.fp16_compress_hook
            if hook_type == DDPCommunicationHookType.FP16
            else default_hooks.bf16_compress_hook
        )
        model.register_comm_hook(None, fn)

    @contextlib.contextmanager
    def no_sync(self, model: torch.nn.Module) -> Iterator[None]:
        if isinstance(model, DistributedDataParallel):
            with model.no_sync():
                yield
        else:
            yield

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return model.module if isinstance(model, DistributedDataParallel) else model
