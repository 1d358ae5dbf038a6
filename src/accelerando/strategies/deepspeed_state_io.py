"""DeepSpeed's own checkpoints, one per engine, inside the atomic checkpoint folder.

A trained engine writes `engine.save_checkpoint` under the tag `pytorch_model` (`pytorch_model_1`,
... for the next models: Accelerate's names, so DeepSpeed's `zero_to_fp32.py` works on the folder),
every rank its own ZeRO partitions of the optimizer (and ZeRO-3 weights). An engine built without
optimizer (a frozen teacher) cannot use it, so each rank stores what it keeps of the weights
(ZeRO-3: its partitions). The checkpointer stages, lists and validates the files; loading restores
the engines exactly, including the optimizer's fp32 master weights and the engine's counters.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from accelerando.checkpoint import state_dict as sd_io
from accelerando.checkpoint.atomic import CheckpointError
from accelerando.checkpoint.state_io import OptimizerSlot, StateIO, StateRead
from accelerando.strategies import deepspeed_weights
from accelerando.utils.constants import MODEL_NAME

if TYPE_CHECKING:
    from accelerando.checkpoint.atomic import StagedCheckpoint
    from accelerando.checkpoint.layout import Layout
    from accelerando.strategies.deepspeed import DeepSpeedStrategy, Engine

_ENGINES_KEY = "deepspeed_engines"


def engine_tag(i: int) -> str:
    return MODEL_NAME if i == 0 else f"{MODEL_NAME}_{i}"


def _frozen_file(tag: str, rank: int) -> str:
    return f"{tag}/frozen_weights_rank_{rank}.bin"


class DeepSpeedStateIO(StateIO):
    name = "deepspeed"

    def __init__(self, strategy: DeepSpeedStrategy) -> None:
        self.strategy = strategy

    def describe(self) -> dict[str, Any]:
        engines = [{"stage": e.stage, "optimizer": e.trainable} for e in self.strategy.engines]
        return {"sharded": True, _ENGINES_KEY: engines}

    def refusal(self, meta: dict[str, Any]) -> str | None:
        saved_world, world = int(meta.get("world_size", 1)), self.strategy.ctx.world_size
        if saved_world != world:
            return (
                f"its ZeRO partitions were saved by {saved_world} processes and this run has {world}; load it with "
                f"{saved_world} processes (or convert it with DeepSpeed's zero_to_fp32.py)"
            )
        live = self.describe()[_ENGINES_KEY]
        saved = meta.get(_ENGINES_KEY)
        if saved is not None and saved != live:
            return f"it holds DeepSpeed engines {saved}, but this run prepared {live} (ZeRO stage, optimizer)"
        return None

    def _record(self, model: torch.nn.Module) -> Engine:
        return self.strategy.record(model)

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
        """Collective: every rank writes its part of every engine; each records the files it wrote."""

        def mine(fname: str) -> bool:
            return f"zero_pp_rank_{rank}_" in fname or (rank == 0 and "zero_pp_rank_" not in fname)

        for i, model in enumerate(models):
            record, tag = self._record(model), engine_tag(i)
            if record.trainable:
                record.engine.save_checkpoint(str(stage.path), tag=tag, client_state={}, save_latest=False)
                stage.track_tree(tag, mine)
            elif record.stage == 3 or rank == 0:
                stage.write(_frozen_file(tag, rank), deepspeed_weights.partition_state(record.engine))
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
        """Checks this rank's files of every engine; frozen weights are read into memory here."""
        out, rank = StateRead(), self.strategy.ctx.rank
        for i, model in enumerate(models):
            record, tag = self._record(model), engine_tag(i)
            if record.trainable:
                folder = directory / tag
                wanted = f"zero_pp_rank_{rank}_" if record.stage > 0 else "mp_rank_00_model_states"
                if not folder.is_dir() or not any(wanted in f.name for f in folder.iterdir()):
                    out.problems.append(f"{tag}: no DeepSpeed checkpoint of rank {rank} (*{wanted}*)")
                out.models.append((model, {"tag": tag, "strict": strict}))
                continue
            name = _frozen_file(tag, rank if record.stage == 3 else 0)
            state = sd_io.load_data_file(directory / name)
            out.problems += deepspeed_weights.check_partition_state(record.engine, state, name)
            out.models.append((model, {"frozen": state}))
        out.models = [(m, {**s, "directory": str(directory)}) for m, s in out.models]
        return out

    def apply(self, state: StateRead) -> None:
        for model, entry in state.models:
            engine = self._record(model).engine
            if "frozen" in entry:
                deepspeed_weights.load_partition_state(engine, entry["frozen"])
                continue
            path, _ = engine.load_checkpoint(
                entry["directory"],
                tag=entry["tag"],
                load_module_strict=entry["strict"],
                load_optimizer_states=True,
                load_lr_scheduler_states=True,
            )
            if path is None:
                raise CheckpointError(
                    f"DeepSpeed could not load {entry['tag']!r} from {entry['directory']!r}"
                )
