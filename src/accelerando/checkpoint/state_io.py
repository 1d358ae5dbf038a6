"""The seam between the checkpointer and a strategy: the state I/O of what the strategy owns.

The checkpointer stages files, writes the manifest, validates and applies in two phases; what the
models' and optimizers' state looks like on disk (full state dict files, DCP shards, an engine's
own checkpoint) is the strategy's, behind `Strategy.state_io()`. A new format is a new `StateIO`
next to its strategy; nothing here changes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from accelerando.checkpoint.atomic import StagedCheckpoint
    from accelerando.checkpoint.layout import Layout


@dataclass(frozen=True)
class OptimizerSlot:
    """An optimizer to save or restore, with the prepared model whose parameters it updates."""

    optimizer: torch.optim.Optimizer  # the user's optimizer, not the AcceleratedOptimizer wrapper
    owner: torch.nn.Module | None


@dataclass
class StateRead:
    """Phase one of a load: the states read and checked, not applied yet."""

    models: list[tuple[torch.nn.Module, dict[str, Any]]] = field(default_factory=list)
    optimizers: list[tuple[OptimizerSlot, dict[str, Any]]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # each names a file and what does not fit


class StateIO(ABC):
    """How one strategy writes, reads and applies its models' and optimizers' state."""

    name = ""  # named in errors ("full", "sharded")

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """What the checkpoint's state file records about this format (read back by `refusal`)."""

    @abstractmethod
    def refusal(self, meta: dict[str, Any]) -> str | None:
        """Why a checkpoint whose state file says `meta` cannot be read by this format, or None."""

    def weights_for_hooks(self, models: list[torch.nn.Module]) -> list[dict[str, Any]]:
        """The state dicts save hooks receive (and may pop to skip saving them); none by default."""
        return []

    @abstractmethod
    def save(
        self,
        stage: StagedCheckpoint,
        layout: Layout,
        models: list[torch.nn.Module],
        weights: list[dict[str, Any]],
        optimizers: list[OptimizerSlot],
        *,
        writer: bool,
        rank: int,
    ) -> int:
        """Write into the staging directory (every rank calls it); returns the models saved."""

    @abstractmethod
    def read(
        self,
        directory: Path,
        layout: Layout,
        models: list[torch.nn.Module],
        optimizers: list[OptimizerSlot],
        *,
        strict: bool = True,
    ) -> StateRead:
        """Read and check every state against the live objects without changing them."""

    @abstractmethod
    def apply(self, state: StateRead) -> None:
        """Phase two: load what `read` returned into the live models and optimizers."""
