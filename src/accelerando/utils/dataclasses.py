"""Accelerate's `utils.dataclasses` names, defined in `accelerando.config.options` and
`accelerando.parallelism_config`; `FP8RecipeKwargs`, kept for Accelerate 1.0 code, is defined here."""

from __future__ import annotations

import importlib.util
import warnings
from dataclasses import dataclass

from accelerando.config import env
from accelerando.config.deepspeed import DeepSpeedPlugin
from accelerando.config.fsdp import (
    FullyShardedDataParallelPlugin,
    get_module_class_from_name,  # noqa: F401 - peft imports it from here
)
from accelerando.config.options import (
    AORecipeKwargs,
    AutocastKwargs,
    BaseEnum,
    ComputeEnvironment,
    DataLoaderConfiguration,
    DDPCommunicationHookType,
    DistributedDataParallelKwargs,
    DistributedType,
    DynamoBackend,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    KwargsHandler,
    LoggerType,
    PrecisionType,
    ProfileKwargs,
    ProjectConfiguration,
    RNGType,
    SageMakerDistributedType,
    TorchDynamoPlugin,
)
from accelerando.parallelism_config import (
    DeepSpeedSequenceParallelConfig,
    TorchContextParallelConfig,
    TorchTensorParallelConfig,
)

FP8_BACKENDS = ("MSAMP", "TE")
FP8_FORMATS = ("HYBRID", "E4M3", "E5M2")
AMAX_COMPUTE_ALGORITHMS = ("max", "most_recent")
MSAMP_OPT_LEVELS = ("O1", "O2")
# The package each FP8RecipeKwargs backend needs (torchao's recipe is AORecipeKwargs).
_FP8_BACKEND_PACKAGES = {"TE": "transformer_engine", "MSAMP": "msamp"}


def _fp8_env(name: str) -> str | None:
    """`ACCELERANDO_FP8_<name>` (or `ACCELERATE_FP8_<name>`), as `accelerando launch --fp8_*` writes it."""
    return env.lookup("FP8_" + name)


def _fp8_int(name: str, default: int) -> int:
    value = env.integer("FP8_" + name)
    return default if value is None else value


@dataclass
class FP8RecipeKwargs(KwargsHandler):
    """Accelerate 1.0's FP8 recipe for Transformer Engine or MS-AMP, chosen by `backend` (deprecated).

    Fields left None come from the `ACCELERATE_FP8_*` variables, else Accelerate's defaults. The values
    are validated here; the backend's package must be installed. New code uses `TERecipeKwargs`,
    `MSAMPRecipeKwargs` or `AORecipeKwargs`.
    """

    opt_level: str | None = None
    use_autocast_during_eval: bool | None = None
    margin: int | None = None
    interval: int | None = None
    fp8_format: str | None = None
    amax_history_len: int | None = None
    amax_compute_algo: str | None = None
    override_linear_precision: tuple[bool, bool, bool] | None = None
    backend: str | None = None

    def __post_init__(self) -> None:
        warnings.warn(
            "FP8RecipeKwargs is deprecated and will be removed in Accelerate v2.0.0. Please use one of the "
            "proper FP8 recipe kwargs classes such as TERecipeKwargs, MSAMPRecipeKwargs or AORecipeKwargs instead.",
            FutureWarning,
            stacklevel=3,
        )
        if self.backend is None:
            self.backend = _fp8_env("BACKEND") or ("msamp" if importlib.util.find_spec("msamp") else "te")
        self.backend = self.backend.upper()
        if self.backend not in FP8_BACKENDS:
            raise ValueError(
                f"`backend` must be 'MSAMP' or 'TE' (TransformerEngine) to use `FP8RecipeKwargs`, got "
                f"{self.backend!r}; for torchao use AORecipeKwargs"
            )
        self._resolve_te_fields()
        self._resolve_msamp_fields()
        package = _FP8_BACKEND_PACKAGES[self.backend]
        if importlib.util.find_spec(package) is None:
            raise ImportError(
                f"FP8RecipeKwargs(backend={self.backend!r}) needs the {package!r} package, which is not installed; "
                "install it, or use AORecipeKwargs (torchao) with mixed_precision='fp8'"
            )

    def _resolve_te_fields(self) -> None:
        if self.use_autocast_during_eval is None:
            self.use_autocast_during_eval = env.flag("FP8_USE_AUTOCAST_DURING_EVAL")
        if self.margin is None:
            self.margin = _fp8_int("MARGIN", 0)
        if self.interval is None:
            self.interval = _fp8_int("INTERVAL", 1)
        self.fp8_format = (self.fp8_format or _fp8_env("FORMAT") or "HYBRID").upper()
        if self.fp8_format not in FP8_FORMATS:
            raise ValueError(
                f"`fp8_format` must be one of {' or '.join(FP8_FORMATS)}, got {self.fp8_format!r}."
            )
        self.amax_compute_algo = (
            self.amax_compute_algo or _fp8_env("AMAX_COMPUTE_ALGO") or "most_recent"
        ).lower()
        if self.amax_compute_algo not in AMAX_COMPUTE_ALGORITHMS:
            raise ValueError(
                f"`amax_compute_algo` must be one of {' or '.join(AMAX_COMPUTE_ALGORITHMS)}, "
                f"got {self.amax_compute_algo!r}"
            )
        if self.amax_history_len is None:
            self.amax_history_len = _fp8_int("AMAX_HISTORY_LEN", 1024)
        if self.override_linear_precision is None:
            self.override_linear_precision = (
                env.flag("FP8_OVERRIDE_FPROP"),
                env.flag("FP8_OVERRIDE_DGRAD"),
                env.flag("FP8_OVERRIDE_WGRAD"),
            )

    def _resolve_msamp_fields(self) -> None:
        if self.opt_level is None:
            self.opt_level = _fp8_env("OPT_LEVEL") or "O2"
        if self.opt_level not in MSAMP_OPT_LEVELS:
            raise ValueError(
                f"`opt_level` must be one of {' or '.join(MSAMP_OPT_LEVELS)}, got {self.opt_level!r}"
            )


__all__ = [
    "AORecipeKwargs",
    "FullyShardedDataParallelPlugin",
    "AutocastKwargs",
    "BaseEnum",
    "ComputeEnvironment",
    "DDPCommunicationHookType",
    "DataLoaderConfiguration",
    "DeepSpeedPlugin",
    "DeepSpeedSequenceParallelConfig",
    "DistributedDataParallelKwargs",
    "DistributedType",
    "DynamoBackend",
    "FP8RecipeKwargs",
    "GradScalerKwargs",
    "GradientAccumulationPlugin",
    "InitProcessGroupKwargs",
    "KwargsHandler",
    "LoggerType",
    "PrecisionType",
    "ProfileKwargs",
    "ProjectConfiguration",
    "RNGType",
    "SageMakerDistributedType",
    "TorchContextParallelConfig",
    "TorchDynamoPlugin",
    "TorchTensorParallelConfig",
]
