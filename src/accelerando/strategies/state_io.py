"""The two state formats today's strategies own (see `checkpoint/state_io.py` for the seam).

`FullStateIO` (single device, DDP, FSDP2 with FULL_STATE_DICT): the writer rank stores each
model's full state dict as one safetensors (or `torch.save`) file and each optimizer's as a
`torch.save` file. `DCPStateIO` (FSDP2 with SHARDED_STATE_DICT): every rank writes its shards
through `torch.distributed.checkpoint` into one folder per model and per optimizer, so a
checkpoint reshards on load to another number of ranks.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from accelerando.checkpoint import state_dict as sd_io
from accelerando.checkpoint.state_io import OptimizerSlot, StateIO, StateRead

if TYPE_CHECKING:
    from accelerando.checkpoint.atomic import StagedCheckpoint
    from accelerando.checkpoint.layout import Layout
    from accelerando.strategies.base import Strategy

_SHARDED_KEY = "sharded"  # the state file's record of the format (a bool, as written since 0.1)


class _StrategyStateIO(StateIO):
    sharded = False

    def __init__(self, strategy: Strategy) -> None:
        self.strategy = strategy

    def describe(self) -> dict[str, Any]:
        return {_SHARDED_KEY: self.sharded}

    def refusal(self, meta: dict[str, Any]) -> str | None:
        """Checkpoints that predate `state_format` say only whether they are sharded."""
        saved = bool(meta.get(_SHARDED_KEY, False))
        if saved == self.sharded:
            return None
        kind = "sharded (DCP)" if saved else "full"
        return f"it holds {kind} state, but strategy {self.strategy.name!r} reads {self.name} state"


class FullStateIO(_StrategyStateIO):
    name = "full"

    def weights_for_hooks(self, models: list[torch.nn.Module]) -> list[dict[str, Any]]:
        return [self.strategy.model_state_dict(m, full=True) for m in models]

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
        strategy = self.strategy
        if writer:
            aligned = len(weights) == len(models)  # a save hook may have taken some weights over
            for i, sd in enumerate(weights):
                drop = sd_io.tied_targets(strategy.unwrap(models[i])) if aligned else set()
                stage.write(
                    layout.model(i), lambda p, sd=sd, d=drop: sd_io.write_model_file(p, sd, layout.safe, d)
                )
        # Collective for sharding strategies: every rank gathers, the writer stores.
        states = [strategy.optimizer_state_dict(s.owner, s.optimizer, full=True) for s in optimizers]
        if writer:
            for i, state in enumerate(states):
                stage.write(layout.optimizer(i), state)
        return len(weights)

    def read(
        self,
        directory: Path,
        layout: Layout,
        models: list[torch.nn.Module],
        optimizers: list[OptimizerSlot],
        *,
        strict: bool = True,
    ) -> StateRead:
        out = StateRead()
        for i, model in enumerate(models):
            state = sd_io.read_model_file(directory / layout.model(i))
            expected = self.strategy.model_state_dict(model, full=False)  # names and shapes, no gather
            out.problems += sd_io.check_model_state(expected, state, layout.model(i), strict=strict)
            out.models.append((model, state))
        for i, slot in enumerate(optimizers):
            state = sd_io.load_data_file(directory / layout.optimizer(i))
            out.problems += sd_io.check_optimizer_state(slot.optimizer, state, layout.optimizer(i))
            out.optimizers.append((slot, state))
        return out

    def apply(self, state: StateRead) -> None:
        for model, sd in state.models:
            self.strategy.load_model_state_dict(model, sd, full=True)
        for slot, sd in state.optimizers:
            self.strategy.load_optimizer_state_dict(slot.owner, slot.optimizer, sd, full=True)


class DCPStateIO(_StrategyStateIO):
    name = "sharded"
    sharded = True

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
        """DCP from every rank into the staging directory; each rank records the files it wrote."""
        strategy = self.strategy

        def mine(fname: str) -> bool:
            return fname.startswith(f"__{rank}_") or (rank == 0 and not fname.startswith("__"))

        for i, model in enumerate(models):
            state = {"model": strategy.model_state_dict(model, full=False)}
            stage.save_sharded(layout.sharded_model(i), state, mine)
        for i, slot in enumerate(optimizers):
            state = {"optimizer": strategy.optimizer_state_dict(slot.owner, slot.optimizer, full=False)}
            stage.save_sharded(layout.sharded_optimizer(i), state, mine)
        return len(models)

    def read(
        self,
        directory: Path,
        layout: Layout,
        models: list[torch.nn.Module],
        optimizers: list[OptimizerSlot],
        *,
        strict: bool = True,
    ) -> StateRead:
        """DCP reads into copies of this rank's shards (collective on every rank)."""
        strategy, out = self.strategy, StateRead()
        for i, model in enumerate(models):
            template = {"model": strategy.model_state_dict(model, full=False)}
            loaded = sd_io.load_sharded(directory / layout.sharded_model(i), template)
            out.models.append((model, loaded["model"]))
        for i, slot in enumerate(optimizers):
            template = {"optimizer": strategy.optimizer_state_dict(slot.owner, slot.optimizer, full=False)}
            loaded = sd_io.load_sharded(directory / layout.sharded_optimizer(i), template)
            out.optimizers.append((slot, loaded["optimizer"]))
        return out

    def apply(self, state: StateRead) -> None:
        for model, sd in state.models:
            self.strategy.load_model_state_dict(model, sd, full=False)
        for slot, sd in state.optimizers:
            self.strategy.load_optimizer_state_dict(slot.owner, slot.optimizer, sd, full=False)
