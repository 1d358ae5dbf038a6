"""Distribution strategies: single device, DDP, FSDP2 (and DeepSpeed next), chosen by registry."""

from accelerando.strategies.base import Capabilities, Strategy, StrategyContext
from accelerando.strategies.registry import STRATEGIES, build_strategy

__all__ = ["STRATEGIES", "Capabilities", "Strategy", "StrategyContext", "build_strategy"]
