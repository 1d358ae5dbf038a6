"""`AcceleratedScheduler`: Accelerate's LR-scheduler semantics, stated once (see docs/scheduler.md).

- With `step_with_optimizer=True` (the default) the schedule advances only on steps where the
  optimizers actually stepped: not on accumulation steps, not after an fp16 overflow skip.
- Without `split_batches`, each optimizer step advances the schedule once per data-parallel rank
  (`num_processes` without tensor or context parallelism), because a schedule written for one
  process counts per-process batches.
- With accumulation and `adjust_scheduler`, skipped micro-steps still advance the step counter.
"""

from __future__ import annotations

from typing import Any

from accelerando import _runtime


class AcceleratedScheduler:
    def __init__(
        self,
        scheduler: Any,
        optimizers: Any,
        step_with_optimizer: bool = True,
        split_batches: bool = False,
    ) -> None:
        self.scheduler = scheduler
        self.optimizers = optimizers if isinstance(optimizers, (list, tuple)) else [optimizers]
        self.split_batches = split_batches
        self.step_with_optimizer = step_with_optimizer
        self._runtime = _runtime.require_runtime()

    def step(self, *args: Any, **kwargs: Any) -> None:
        if not self.step_with_optimizer:
            self.scheduler.step(*args, **kwargs)
            return
        gradient = self._runtime.gradient
        if not gradient.sync_gradients:
            if gradient.adjust_scheduler:
                self.scheduler._step_count += 1
            return
        if any(getattr(opt, "step_was_skipped", False) for opt in self.optimizers):
            return
        repeats = 1 if self.split_batches else self._data_parallel_size()
        for _ in range(repeats):
            total = getattr(self.scheduler, "total_steps", None)
            if total is not None and self.scheduler._step_count > total:
                break  # OneCycleLR raises past its end
            self.scheduler.step(*args, **kwargs)

    def _data_parallel_size(self) -> int:
        strategy = self._runtime.strategy
        return strategy.data_parallel_size if strategy is not None else self._runtime.topology.world_size

    def get_last_lr(self) -> list[float]:
        return self.scheduler.get_last_lr()

    def state_dict(self) -> dict[str, Any]:
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state_dict)

    def get_lr(self) -> Any:
        return self.scheduler.get_lr()

    def print_lr(self, *args: Any, **kwargs: Any) -> Any:
        return self.scheduler.print_lr(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name in ("scheduler", "_runtime"):
            raise AttributeError(name)
        return getattr(self.scheduler, name)
