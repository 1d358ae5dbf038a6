"""File names inside a `save_state` folder; Accelerate's names, so tools that know them still work."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from accelerando.utils.constants import (
    FSDP_MODEL_NAME,
    MODEL_NAME,
    OPTIMIZER_NAME,
    RNG_STATE_NAME,
    SAFE_MODEL_NAME,
    SCHEDULER_NAME,
)

DATALOADER_NAME = "dl_state_dict"
CUSTOM_NAME = "custom_checkpoint"


def _indexed(stem: str, i: int, suffix: str) -> str:
    return f"{stem}{suffix}" if i == 0 else f"{stem}_{i}{suffix}"


@dataclass(frozen=True)
class Layout:
    safe_serialization: bool = True

    @property
    def safe(self) -> bool:
        return self.safe_serialization

    def model(self, i: int) -> str:
        if self.safe_serialization:
            return _indexed(SAFE_MODEL_NAME, i, ".safetensors")
        return _indexed(MODEL_NAME, i, ".bin")

    def optimizer(self, i: int) -> str:
        return _indexed(OPTIMIZER_NAME, i, ".bin")

    def scheduler(self, i: int) -> str:
        return _indexed(SCHEDULER_NAME, i, ".bin")

    def dataloader(self, i: int) -> str:
        return _indexed(DATALOADER_NAME, i, ".bin")

    def custom(self, i: int) -> str:
        return f"{CUSTOM_NAME}_{i}.pkl"

    def rng(self, rank: int) -> str:
        return f"{RNG_STATE_NAME}_{rank}.pkl"

    def sharded_model(self, i: int) -> str:
        return f"{FSDP_MODEL_NAME}_{i}"

    def sharded_optimizer(self, i: int) -> str:
        return f"{OPTIMIZER_NAME}_{i}"

    def describe(self) -> dict[str, Any]:
        return {"safe_serialization": self.safe_serialization}

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> Layout:
        return cls(safe_serialization=bool(meta.get("safe_serialization", True)))
