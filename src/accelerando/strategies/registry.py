"""Strategies by name; a new backend is a new file and one line here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from accelerando.strategies.base import Strategy, StrategyContext
from accelerando.strategies.ddp import DDPStrategy
from accelerando.strategies.single_device import SingleDeviceStrategy


def _fsdp2(ctx: StrategyContext, **kwargs: Any) -> Strategy:
    from accelerando.strategies.fsdp2 import FSDP2Strategy

    return FSDP2Strategy(ctx, **kwargs)


STRATEGIES: dict[str, Callable[..., Strategy]] = {
    "single_device": SingleDeviceStrategy,
    "ddp": DDPStrategy,
    "fsdp2": _fsdp2,
}


def build_strategy(name: str, ctx: StrategyContext, **kwargs: Any) -> Strategy:
    try:
        factory = STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; accepted: {', '.join(STRATEGIES)}") from None
    return factory(ctx, **kwargs)
