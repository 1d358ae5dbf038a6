"""Distribution strategies: single device, DDP, FSDP2, DeepSpeed, chosen by registry."""

from accelerando.strategies.base import Capabilities, Prepared, PrepareRequest, Strategy, StrategyContext
from accelerando.strategies.registry import STRATEGIES, build_strategy, strategy_class
from accelerando.strategies.resolve import resolve_strategy, strategy_name

__all__ = [
    "STRATEGIES",
    "Capabilities",
    "PrepareRequest",
    "Prepared",
    "Strategy",
    "StrategyContext",
    "build_strategy",
    "resolve_strategy",
    "strategy_class",
    "strategy_name",
]
