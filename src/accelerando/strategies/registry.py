"""Strategies by name; a new backend is a new file and one line here.

Entries are loaders, so a strategy's module (and its torch imports) loads only when chosen.
A name whose backend does not exist yet is listed with the reason, so asking for it is refused
with a clear message instead of silently training something else.
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


def _not_available(what: str, issue: int) -> Callable[[], type[Strategy]]:
    def refuse() -> type[Strategy]:
        raise ValueError(
            f"{what} is not available yet in accelerando (tracked in issue {issue}); "
            f"train without it (DDP or FSDP) until it lands"
        )

    return refuse


STRATEGIES: dict[str, Callable[[], type[Strategy]]] = {
    "single_device": _single_device,
    "ddp": _ddp,
    "fsdp2": _fsdp2,
    "deepspeed": _not_available("DeepSpeed", 21),
}


def strategy_class(name: str) -> type[Strategy]:
    try:
        loader = STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; accepted: {', '.join(STRATEGIES)}") from None
    return loader()


def build_strategy(name: str, ctx: StrategyContext, **kwargs: Any) -> Strategy:
    return strategy_class(name)(ctx, **kwargs)
