"""Strategies by name; a new backend is a new file and one line here.

Entries are loaders, so a strategy's module (and its torch imports) loads only when chosen.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from accelerando.strategies.base import Strategy, StrategyContext


def _single_device() -> type[Strategy]:
    from accelerando.strategies.single_device import SingleDeviceStrategy

    return SingleDeviceStrategy


def _ddp() -> type[Strategy]:
    from accelerando.strategies.ddp import DDPStrategy

    return DDPStrategy


def _fsdp2() -> type[Strategy]:
    from accelerando.strategies.fsdp2 import FSDP2Strategy

    return FSDP2Strategy


def _deepspeed() -> type[Strategy]:
    from accelerando.strategies.deepspeed import DeepSpeedStrategy

    return DeepSpeedStrategy


STRATEGIES: dict[str, Callable[[], type[Strategy]]] = {
    "single_device": _single_device,
    "ddp": _ddp,
    "fsdp2": _fsdp2,
    "deepspeed": _deepspeed,
}


def strategy_class(name: str) -> type[Strategy]:
    try:
        loader = STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; accepted: {', '.join(STRATEGIES)}") from None
    return loader()


def build_strategy(name: str, ctx: StrategyContext, **kwargs: Any) -> Strategy:
    return strategy_class(name)(ctx, **kwargs)
