"""Accelerate's `utils.dataclasses` names, defined in `accelerando.config.options` and
`accelerando.parallelism_config`; `FP8RecipeKwargs`, kept for Accelerate 1.0 code, is defined here."""

from __future__ import annotations

import importlib.util
import warnings
from dataclasses import dataclass

import torch

from accelerando.config import env
from accelerando.config.deepspeed import DeepSpeedPlugin
from accelerando.config.fp8 import complete_recipe
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
    MSAMPRecipeKwargs,
    PrecisionType,
    ProfileKwargs,
    ProjectConfiguration,
    RNGType,
    SageMakerDistributedType,
    TERecipeKwargs,
    TorchDynamoPlugin,
)
from accelerando.parallelism_config import (
    DeepSpeedSequenceParallelConfig,
    TorchContextParallelConfig,
    TorchTensorParallelConfig,
    TorchTensorParallelPlugin,
)

FP8_BACKENDS = ("MSAMP", "TE")
# The package each FP8RecipeKwargs backend needs (torchao's recipe is AORecipeKwargs).
_FP8_BACKEND_PACKAGES = {"TE": "transformer_engine", "MSAMP": "msamp"}
_TE_FIELDS = (
    "use_autocast_during_eval", "margin", "interval", "fp8_format", "amax_history_len", "amax_compute_algo",
    "override_linear_precision",
)  # fmt: skip


@dataclass
class FP8RecipeKwargs(KwargsHandler):
    """Accelerate 1.0's FP8 recipe for Transformer Engine or MS-AMP, chosen by `backend` (deprecated).

    An alias kept for 1.0 code: the fields are those of `TERecipeKwargs` and `MSAMPRecipeKwargs`,
    validated and completed by them (unset fields from the `ACCELERATE_FP8_*` variables, else the
    defaults); `to_recipe()` gives the backend's own recipe, which is what `Accelerator` uses.
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
        settings = env.read_settings()
        if self.backend is None:
            self.backend = settings.fp8_backend or ("msamp" if importlib.util.find_spec("msamp") else "te")
        self.backend = self.backend.upper()
        if self.backend not in FP8_BACKENDS:
            raise ValueError(
                f"`backend` must be 'MSAMP' or 'TE' (TransformerEngine) to use `FP8RecipeKwargs`, got "
                f"{self.backend!r}; for torchao use AORecipeKwargs"
            )
        te = complete_recipe("te", TERecipeKwargs(**{f: getattr(self, f) for f in _TE_FIELDS}), settings)
        msamp = complete_recipe("msamp", MSAMPRecipeKwargs(self.opt_level), settings)
        for name in _TE_FIELDS:
            setattr(self, name, getattr(te, name))
        self.opt_level = msamp.opt_level  # type: ignore[union-attr]
        package = _FP8_BACKEND_PACKAGES[self.backend]
        if importlib.util.find_spec(package) is None:
            raise ImportError(
                f"FP8RecipeKwargs(backend={self.backend!r}) needs the {package!r} package, which is not installed; "
                "install it, or use AORecipeKwargs (torchao) with mixed_precision='fp8'"
            )

    def to_recipe(self) -> TERecipeKwargs | MSAMPRecipeKwargs:
        """The backend's own recipe with these values (what `Accelerator(kwargs_handlers=...)` uses)."""
        if self.backend == "MSAMP":
            return MSAMPRecipeKwargs(opt_level=self.opt_level)
        return TERecipeKwargs(**{f: getattr(self, f) for f in _TE_FIELDS})


@dataclass
class TensorInformation:
    """Shape and dtype of a tensor another process will send (see `utils.get_data_structure`)."""

    shape: torch.Size
    dtype: torch.dtype


__all__ = [
    "TensorInformation",
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
    "MSAMPRecipeKwargs",
    "TERecipeKwargs",
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
    "TorchTensorParallelPlugin",
]
