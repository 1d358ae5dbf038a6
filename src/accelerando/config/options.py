"""User-facing configuration objects: enums, plugins and kwargs handlers with Accelerate's names.

They are plain dataclasses holding what the user asked for. Nothing here reads the environment;
`config.resolve` merges these with the launcher's environment into one frozen `ResolvedConfig`.
"""

from __future__ import annotations

import copy
import enum
from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import Any, ClassVar

from accelerando.config import env


class _ContainsMeta(enum.EnumMeta):
    def __contains__(cls, item: object) -> bool:  # "fp16" in PrecisionType
        try:
            cls(item)
        except ValueError:
            return False
        return True


class BaseEnum(str, enum.Enum, metaclass=_ContainsMeta):
    """A str enum whose `str()` is its value and whose `list()` gives every value."""

    def __str__(self) -> str:
        return str(self.value)

    @classmethod
    def list(cls) -> list[str]:
        return [str(m.value) for m in cls]


class DistributedType(BaseEnum):
    NO = "NO"
    MULTI_CPU = "MULTI_CPU"
    MULTI_GPU = "MULTI_GPU"
    MULTI_NPU = "MULTI_NPU"
    MULTI_MLU = "MULTI_MLU"
    MULTI_SDAA = "MULTI_SDAA"
    MULTI_MUSA = "MULTI_MUSA"
    MULTI_XPU = "MULTI_XPU"
    MULTI_HPU = "MULTI_HPU"
    MULTI_NEURON = "MULTI_NEURON"
    DEEPSPEED = "DEEPSPEED"
    FSDP = "FSDP"
    XLA = "XLA"
    MEGATRON_LM = "MEGATRON_LM"


class PrecisionType(BaseEnum):
    NO = "no"
    FP8 = "fp8"
    FP16 = "fp16"
    BF16 = "bf16"


class RNGType(BaseEnum):
    TORCH = "torch"
    CUDA = "cuda"
    MLU = "mlu"
    SDAA = "sdaa"
    MUSA = "musa"
    NPU = "npu"
    XLA = "xla"
    XPU = "xpu"
    HPU = "hpu"
    NEURON = "neuron"
    GENERATOR = "generator"


class LoggerType(BaseEnum):
    ALL = "all"
    AIM = "aim"
    TENSORBOARD = "tensorboard"
    WANDB = "wandb"
    TRACKIO = "trackio"
    COMETML = "comet_ml"
    MLFLOW = "mlflow"
    CLEARML = "clearml"
    DVCLIVE = "dvclive"
    SWANLAB = "swanlab"


class DynamoBackend(BaseEnum):
    NO = "NO"
    EAGER = "EAGER"
    AOT_EAGER = "AOT_EAGER"
    INDUCTOR = "INDUCTOR"
    AOT_TS_NVFUSER = "AOT_TS_NVFUSER"
    NVPRIMS_NVFUSER = "NVPRIMS_NVFUSER"
    CUDAGRAPHS = "CUDAGRAPHS"
    OFI = "OFI"
    FX2TRT = "FX2TRT"
    ONNXRT = "ONNXRT"
    TENSORRT = "TENSORRT"
    AOT_TORCHXLA_TRACE_ONCE = "AOT_TORCHXLA_TRACE_ONCE"
    TORCHXLA_TRACE_ONCE = "TORCHXLA_TRACE_ONCE"
    TVM = "TVM"
    HPU_BACKEND = "HPU_BACKEND"
    NEURON = "NEURON"


class DDPCommunicationHookType(BaseEnum):
    NO = "no"
    FP16 = "fp16"
    BF16 = "bf16"
    POWER_SGD = "power_sgd"
    BATCHED_POWER_SGD = "batched_power_sgd"


class ComputeEnvironment(BaseEnum):
    LOCAL_MACHINE = "LOCAL_MACHINE"
    AMAZON_SAGEMAKER = "AMAZON_SAGEMAKER"


class SageMakerDistributedType(BaseEnum):
    """`distributed_type` of a SageMaker config file (read and written; accelerando does not launch it)."""

    NO = "NO"
    DATA_PARALLEL = "DATA_PARALLEL"
    MODEL_PARALLEL = "MODEL_PARALLEL"


class KwargsHandler:
    """Base of the `*Kwargs` handlers: `to_kwargs()` returns only the fields the user changed."""

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy(self.__dict__)

    def to_kwargs(self) -> dict[str, Any]:
        default = self.__class__()
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)  # type: ignore[arg-type]
            if getattr(self, f.name) != getattr(default, f.name)
        }


@dataclass
class AutocastKwargs(KwargsHandler):
    enabled: bool = True
    cache_enabled: bool | None = None


@dataclass
class GradScalerKwargs(KwargsHandler):
    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    enabled: bool = True


@dataclass
class InitProcessGroupKwargs(KwargsHandler):
    """Forwarded to `torch.distributed.init_process_group`. `backend=None` means the device's own."""

    backend: str | None = None
    init_method: str | None = None
    timeout: timedelta | None = None


@dataclass
class DistributedDataParallelKwargs(KwargsHandler):
    dim: int = 0
    broadcast_buffers: bool = True
    bucket_cap_mb: int = 25
    find_unused_parameters: bool = False
    check_reduction: bool = False
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    comm_hook: DDPCommunicationHookType = DDPCommunicationHookType.NO
    comm_wrapper: DDPCommunicationHookType = DDPCommunicationHookType.NO
    comm_state_option: dict = field(default_factory=dict)

    def to_dict(
        self, ignore_keys: tuple[str, ...] = ("comm_hook", "comm_wrapper", "comm_state_option")
    ) -> dict:
        return {k: v for k, v in super().to_dict().items() if k not in ignore_keys}


@dataclass
class ProfileKwargs(KwargsHandler):
    activities: list[str] | None = None
    schedule_option: dict[str, int] | None = None
    on_trace_ready: Any = None
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False
    with_modules: bool = False
    output_trace_dir: str | None = None

    def build(self) -> Any:
        """The `torch.profiler.profile` these options describe (what `Accelerator.profile` enters)."""
        from accelerando.profiling import build_profiler

        return build_profiler(self)


FP8_BACKENDS = ("ao", "te", "msamp")  # torchao, Transformer Engine, MS-AMP
AO_RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp")
FP8_FORMATS = ("HYBRID", "E4M3", "E5M2")
AMAX_COMPUTE_ALGORITHMS = ("max", "most_recent")
MSAMP_OPT_LEVELS = ("O1", "O2")


def _one_of(field_name: str, value: str, accepted: tuple[str, ...]) -> None:
    if value not in accepted:
        raise ValueError(f"`{field_name}` must be one of {' or '.join(accepted)}, got {value!r}")


@dataclass
class AORecipeKwargs(KwargsHandler):
    """fp8 through torchao: a `Float8LinearConfig` (or a recipe name) and which Linear layers to convert.

    `config` wins over the other fields. Without it the config is built from `recipe_name`
    (torchao's `tensorwise`, `rowwise`, `rowwise_with_gw_hp`; default tensorwise) and the two switches
    the launcher can set; fields left None come from the launcher, else torchao's defaults.
    """

    config: Any = None
    module_filter_func: Any = None
    pad_inner_dim: bool | None = None
    enable_fsdp_float8_all_gather: bool | None = None
    recipe_name: str | None = None
    backend: ClassVar[str] = "ao"

    def __post_init__(self) -> None:
        if self.recipe_name is not None:
            self.recipe_name = self.recipe_name.lower()
            _one_of("recipe_name", self.recipe_name, AO_RECIPES)


@dataclass
class TERecipeKwargs(KwargsHandler):
    """fp8 through Transformer Engine: the `DelayedScaling` recipe's fields, Accelerate's names.

    Fields left None come from the launcher (`--fp8_*`), else Transformer Engine's defaults as
    Accelerate sets them. Explicit values are checked here, before any work.
    """

    use_autocast_during_eval: bool | None = None
    margin: int | None = None
    interval: int | None = None
    fp8_format: str | None = None
    amax_history_len: int | None = None
    amax_compute_algo: str | None = None
    override_linear_precision: tuple[bool, bool, bool] | None = None
    backend: ClassVar[str] = "te"

    def __post_init__(self) -> None:
        if self.fp8_format is not None:
            self.fp8_format = self.fp8_format.upper()
            _one_of("fp8_format", self.fp8_format, FP8_FORMATS)
        if self.amax_compute_algo is not None:
            self.amax_compute_algo = self.amax_compute_algo.lower()
            _one_of("amax_compute_algo", self.amax_compute_algo, AMAX_COMPUTE_ALGORITHMS)
        for name in ("margin", "interval", "amax_history_len"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < (1 if name != "margin" else 0)):
                raise ValueError(
                    f"`{name}` must be an integer >= {0 if name == 'margin' else 1}, got {value!r}"
                )
        olp = self.override_linear_precision
        if olp is not None and (len(tuple(olp)) != 3 or not all(isinstance(b, bool) for b in olp)):
            raise ValueError(
                f"`override_linear_precision` must be three booleans (fprop, dgrad, wgrad), got {olp!r}"
            )


@dataclass
class MSAMPRecipeKwargs(KwargsHandler):
    """fp8 through MS-AMP: `msamp.initialize(model, optimizer, opt_level)`; O1 keeps fp8 weights and
    gradients, O2 also fp8/fp16 optimizer states. None comes from the launcher, else O2."""

    opt_level: str | None = None
    backend: ClassVar[str] = "msamp"

    def __post_init__(self) -> None:
        if self.opt_level is not None:
            self.opt_level = self.opt_level.upper()
            _one_of("opt_level", self.opt_level, MSAMP_OPT_LEVELS)


FP8_RECIPES = (AORecipeKwargs, TERecipeKwargs, MSAMPRecipeKwargs)


@dataclass
class GradientAccumulationPlugin(KwargsHandler):
    """How gradient accumulation behaves. `num_steps=None` means 1."""

    num_steps: int | None = None
    adjust_scheduler: bool = True
    sync_with_dataloader: bool = True
    sync_each_batch: bool = False


@dataclass
class TorchDynamoPlugin(KwargsHandler):
    backend: DynamoBackend | str | None = None
    mode: str | None = None
    fullgraph: bool | None = None
    dynamic: bool | None = None
    options: Any = None
    disable: bool = False
    use_regional_compilation: bool | None = None

    def __post_init__(self) -> None:
        # Like Accelerate, unset fields come from the launcher's ACCELERATE(O)_DYNAMO_* variables.
        settings = env.read_settings()
        if self.backend is None:
            self.backend = settings.dynamo_backend or DynamoBackend.NO
        if self.mode is None:
            self.mode = settings.dynamo_mode or "default"
        if self.fullgraph is None:
            self.fullgraph = bool(settings.dynamo_fullgraph)
        if self.dynamic is None:
            self.dynamic = settings.dynamo_dynamic
        if self.use_regional_compilation is None:
            self.use_regional_compilation = bool(settings.dynamo_regional)
        if not isinstance(self.backend, DynamoBackend):
            name = str(self.backend).upper()
            if name not in DynamoBackend:
                raise ValueError(
                    f"dynamo backend {self.backend!r} is unknown; accepted: {', '.join(DynamoBackend.list())}"
                )
            self.backend = DynamoBackend(name)

    def to_kwargs(self) -> dict[str, Any]:
        """`torch.compile` keywords. Spelled out: a default instance also reads the environment,
        so comparing against it (as other handlers do) would drop launcher-set values."""
        kwargs: dict[str, Any] = {
            "backend": str(self.backend).lower(),
            "mode": self.mode,
            "fullgraph": self.fullgraph,
            "dynamic": self.dynamic,
        }
        if self.options is not None:  # torch.compile takes mode or options, not both
            kwargs["options"] = self.options
            if self.mode == "default":
                del kwargs["mode"]
        if self.disable:
            kwargs["disable"] = True
        return kwargs


@dataclass
class DataLoaderConfiguration:
    """How `prepare` shards data loaders (see docs/data.md)."""

    split_batches: bool = False
    dispatch_batches: bool | None = None
    even_batches: bool = True
    use_seedable_sampler: bool = False
    data_seed: int | None = None
    non_blocking: bool = False
    use_stateful_dataloader: bool = False


@dataclass
class ProjectConfiguration:
    """Where checkpoints and logs go and how checkpoints are named and retained."""

    project_dir: str | None = None
    logging_dir: str | None = None
    automatic_checkpoint_naming: bool = False
    total_limit: int | None = None
    iteration: int = 0
    save_on_each_node: bool = False

    def set_directories(self, project_dir: str | None = None) -> None:
        self.project_dir = project_dir
        if self.logging_dir is None:
            self.logging_dir = project_dir

    def __post_init__(self) -> None:
        self.set_directories(self.project_dir)
