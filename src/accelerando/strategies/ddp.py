"""Data parallel through `torch.nn.parallel.DistributedDataParallel` (gloo on CPU, nccl on CUDA)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch.nn.parallel import DistributedDataParallel

from accelerando.config.options import (
    DDPCommunicationHookType,
    DistributedDataParallelKwargs,
    DistributedType,
)
from accelerando.strategies.base import Strategy, StrategyContext
from accelerando.strategies.compose import refuse_multi_device_map

if TYPE_CHECKING:
    from accelerando.config.resolve import ResolvedConfig

_MULTI = {
    "cpu": DistributedType.MULTI_CPU,
    "cuda": DistributedType.MULTI_GPU,
    "xpu": DistributedType.MULTI_XPU,
    "npu": DistributedType.MULTI_NPU,
    "mlu": DistributedType.MULTI_MLU,
}


class GroupKeeper:
    """Holds a DDP model's process group from Python, so that the group's last reference is never its reducer's.

    Freeing a DDP model frees its attributes in the order they were set. The C++ reducer (and its logger)
    holds the group; if the reducer drops the last reference, the gloo group's destructor joins gloo's
    worker threads while the freeing thread holds the GIL, and a worker still releasing a finished
    collective's tensors (whose Python objects need the GIL) never finishes: the rank hangs where the
    model goes out of scope, e.g. at the end of a script's `main()` after `end_training()`. Set after
    the reducer and logger, this keeper is freed after them, and a Python group object releases the
    GIL before destroying its group. It pickles (and deep-copies) as an empty keeper: groups do not travel.
    """

    __slots__ = ("group",)

    def __init__(self, group: Any) -> None:
        self.group = group

    def __reduce__(self) -> tuple[type[GroupKeeper], tuple[None]]:
        return GroupKeeper, (None,)


class DDPStrategy(Strategy):
    name = "ddp"

    def __init__(self, ctx: StrategyContext, ddp_kwargs: DistributedDataParallelKwargs | None = None) -> None:
        super().__init__(ctx)
        self.ddp_kwargs = ddp_kwargs or DistributedDataParallelKwargs()

    @classmethod
    def options(cls, config: ResolvedConfig) -> dict[str, Any]:
        return {"ddp_kwargs": config.handlers.ddp}

    @property
    def distributed_type(self) -> DistributedType:
        return _MULTI.get(self.ctx.device.type, DistributedType.MULTI_GPU)

    def check_model(self, model: torch.nn.Module) -> None:
        refuse_multi_device_map(model)

    def wrap_model(self, model: torch.nn.Module, *, evaluation_mode: bool = False) -> torch.nn.Module:
        if evaluation_mode or not any(p.requires_grad for p in model.parameters()):
            return model  # nothing to synchronise: inference models stay unwrapped
        if self.ctx.mesh.data_parallel_size == 1:
            return model  # every rank is in one tensor-parallel group: no replica to synchronise with
        device_ids = None if self.ctx.device.type == "cpu" else [self.ctx.device.index or 0]
        arguments = self._ddp_arguments()
        group = self.ctx.mesh.data_parallel_group()  # None: every rank is a replica (the default group)
        if group is not None:
            arguments["process_group"] = group
        wrapped = DistributedDataParallel(model, device_ids=device_ids, **arguments)
        self._register_comm_hook(wrapped)
        # set last, so freed after the reducer and logger: see GroupKeeper
        object.__setattr__(wrapped, "_accelerando_group_keeper", GroupKeeper(wrapped.process_group))
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
            state: Any = powerSGD_hook.PowerSGDState(
                process_group=self.ctx.mesh.data_parallel_group(), **self.ddp_kwargs.comm_state_option
            )
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

    @contextlib.contextmanager
    def sync_in_backward(self, model: torch.nn.Module) -> Iterator[None]:
        """The next backward all-reduces even after forwards under `no_sync` (DDP's reducer is told so)."""
        if not isinstance(model, DistributedDataParallel):
            yield
            return
        previous = model.require_backward_grad_sync
        model.require_backward_grad_sync = True
        model.require_forward_param_sync = True
        model.reducer.prepare_for_backward([])
        try:
            yield
        finally:
            model.require_backward_grad_sync = previous
            model.require_forward_param_sync = previous

    def join_context(self, joinables: list[Any]) -> contextlib.AbstractContextManager:
        """Ranks with fewer batches shadow the others' all-reduces (`torch.distributed.algorithms.Join`)."""
        from torch.distributed.algorithms.join import Join

        return Join(joinables)

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return model.module if isinstance(model, DistributedDataParallel) else model
