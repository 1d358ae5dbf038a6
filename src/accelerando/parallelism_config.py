"""`ParallelismConfig` and its handlers: the sizes of each parallelism dimension, validated once.

Accelerate's dataclasses with their fields, environment defaults (`PARALLELISM_CONFIG_*`, written by
`accelerando launch --parallelism_config_*`) and validation. `mesh_shape(world_size)` turns the sizes
into the job's `MeshShape` (parallel/mesh.py, the one authority on topology), which the strategies
and `build_device_mesh` use. Sequence parallelism (DeepSpeed Ulysses) is validated, then refused by
`mesh_shape` when `sp_size > 1`.
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from accelerando.config import env
from accelerando.config.options import DistributedType

if TYPE_CHECKING:
    from accelerando.parallel.mesh import MeshShape

_ENV_PREFIX = "PARALLELISM_CONFIG_"
# Mesh dimensions in the order they are laid out (outermost first), as Accelerate orders them.
MESH_ORDER = ("dp_replicate", "dp_shard", "cp", "sp", "tp")
CP_BACKENDS = ("torch",)
SP_BACKENDS = ("deepspeed",)
CP_COMM_STRATEGIES = ("allgather", "alltoall")
SP_ATTN_BUILTIN = ("flash_attention_2", "flash_attention_3", "sdpa")
SP_ATTN_REFUSED = ("eager", "flex_attention")
_NO_SP = (
    "sequence parallelism (sp_size > 1) is Accelerate's DeepSpeed ALST/Ulysses path (sp_backend='deepspeed': "
    "DeepSpeed's UlyssesSPAttentionHF and UlyssesSPDataLoaderAdapter), which accelerando does not run yet; "
    "accepted: sp_size=1. To split long sequences use context parallelism (cp_size > 1, with FSDP)"
)


def _setting(name: str) -> str | None:
    """`PARALLELISM_CONFIG_<name>` as the launcher wrote it, or None."""
    return env.raw(_ENV_PREFIX + name)


def _int_setting(name: str, default: int) -> int:
    value = _setting(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {_ENV_PREFIX + name}={value!r} is not an integer") from None


def _bool_setting(name: str, default: bool) -> bool:
    value = _setting(name)
    return default if value is None else env.parse_bool(value, _ENV_PREFIX + name)


@dataclass
class TorchTensorParallelConfig:
    """Tensor-parallel options (`ParallelismConfig.tp_handler`).

    `tp_plan` (accelerando's addition): module path pattern -> `torch.distributed.tensor.parallel`
    `ParallelStyle` (or one of transformers' style names: "colwise", "rowwise", ...), applied by
    `prepare` with `parallelize_module`. Without it a transformers model's own `tp_plan` is used.
    """

    enable_async_tp: bool = False
    tp_plan: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        from accelerando.utils.constants import BETA_TP_AVAILABLE_TRANSFORMERS_VERSION
        from accelerando.utils.imports import is_transformers_available
        from accelerando.utils.versions import compare_versions

        if not is_transformers_available() or not compare_versions(
            "transformers", ">=", BETA_TP_AVAILABLE_TRANSFORMERS_VERSION
        ):
            raise ValueError(f"TP requires transformers >= {BETA_TP_AVAILABLE_TRANSFORMERS_VERSION}")
        if self.enable_async_tp:
            warnings.warn(
                "Async tensor parallelism is currently not supported, ignoring this option.", stacklevel=3
            )


@dataclass
class TorchContextParallelConfig:
    """Context-parallel options (`ParallelismConfig.cp_handler`): how the ranks exchange keys and values."""

    cp_comm_strategy: str | None = None

    def __post_init__(self) -> None:
        if self.cp_comm_strategy is None:
            self.cp_comm_strategy = _setting("CP_COMM_STRATEGY") or "allgather"
        if self.cp_comm_strategy not in CP_COMM_STRATEGIES:
            raise ValueError(
                f"Invalid cp_comm_strategy: {self.cp_comm_strategy}. Must be one of 'allgather' or 'alltoall'."
            )


@dataclass
class DeepSpeedSequenceParallelConfig:
    """DeepSpeed Ulysses sequence-parallel options (`ParallelismConfig.sp_handler`)."""

    sp_seq_length: int | None = None
    sp_seq_length_is_variable: bool | None = None
    sp_attn_implementation: str | None = None
    sp_allow_recurrent_layers: bool | None = None
    sp_disable_in_eval: bool | None = None

    def __post_init__(self) -> None:
        if self.sp_seq_length_is_variable is None:
            self.sp_seq_length_is_variable = _bool_setting("SP_SEQ_LENGTH_IS_VARIABLE", True)
        if not self.sp_seq_length_is_variable and self.sp_seq_length is None:
            value = _setting("SP_SEQ_LENGTH")
            if value is None:
                raise ValueError(
                    "when `sp_seq_length_is_variable` is `False` `sp_seq_length` must be provided either "
                    f"through the constructor or the environment variable {_ENV_PREFIX}SP_SEQ_LENGTH"
                )
            self.sp_seq_length = None if value == "None" else _int_setting("SP_SEQ_LENGTH", 0)
        if self.sp_attn_implementation is None:
            self.sp_attn_implementation = _setting("SP_ATTN_IMPLEMENTATION")
        if self.sp_allow_recurrent_layers is None:
            self.sp_allow_recurrent_layers = _bool_setting("SP_ALLOW_RECURRENT_LAYERS", False)
        if self.sp_disable_in_eval is None:
            self.sp_disable_in_eval = _bool_setting("SP_DISABLE_IN_EVAL", True)
        _check_sp_attention(self.sp_attn_implementation)


def _check_sp_attention(name: str | None) -> None:
    """Built-in flash/sdpa kernels, or a hub-hosted flash-attention kernel ('org/flash-attn...')."""
    if name is None or name in SP_ATTN_BUILTIN:
        return
    if name in SP_ATTN_REFUSED:
        raise ValueError(
            f"Invalid sp_attn_implementation: {name}. "
            "'eager' and 'flex_attention' are not supported with sequence parallelism."
        )
    if "/" not in name or "flash-attn" not in name:
        raise ValueError(
            f"Invalid sp_attn_implementation: {name}. Must be one of {list(SP_ATTN_BUILTIN)} or a hub-hosted "
            "flash attention kernel (e.g. 'kernels-community/flash-attn2')."
        )


@dataclass
class ParallelismConfig:
    """Sizes of the data-replicate, data-shard, tensor, context and sequence parallel dimensions.

    Unset sizes come from `PARALLELISM_CONFIG_*` (set by the launcher), else 1. `dp_replicate_size > 1`
    with `dp_shard_size > 1` is HSDP; `dp_shard_size > 1` alone is FSDP. Context and sequence
    parallelism exclude each other.
    """

    dp_replicate_size: int | None = None
    dp_shard_size: int | None = None
    tp_size: int | None = None
    cp_size: int | None = None
    cp_backend: str | None = None
    sp_size: int | None = None
    sp_backend: str | None = None
    tp_handler: TorchTensorParallelConfig | None = None
    cp_handler: TorchContextParallelConfig | None = None
    sp_handler: DeepSpeedSequenceParallelConfig | None = None

    device_mesh = None

    def __post_init__(self) -> None:
        self.dp_replicate_size = _default_size(self.dp_replicate_size, "DP_REPLICATE_SIZE")
        self.dp_shard_size = _default_size(self.dp_shard_size, "DP_SHARD_SIZE")
        self.tp_size = _default_size(self.tp_size, "TP_SIZE")
        self.cp_size = _default_size(self.cp_size, "CP_SIZE")
        self.sp_size = _default_size(self.sp_size, "SP_SIZE")
        self.cp_backend = self.cp_backend or _setting("CP_BACKEND") or "torch"
        self.sp_backend = self.sp_backend or _setting("SP_BACKEND") or "deepspeed"
        self._default_handlers()
        self._check_sizes()
        self._sizes = {
            name: getattr(self, f"{name}_size") for name in ("dp_replicate", "dp_shard", "tp", "cp", "sp")
        }

    def _default_handlers(self) -> None:
        if self.tp_size > 1 and self.tp_handler is None:  # type: ignore[operator]
            self.tp_handler = TorchTensorParallelConfig()
        if self.cp_size > 1:  # type: ignore[operator]
            if self.cp_handler is None:
                self.cp_handler = TorchContextParallelConfig()
            elif self.cp_backend == "torch" and not isinstance(self.cp_handler, TorchContextParallelConfig):
                raise ValueError(
                    f"ParallelismConfig's cp_backend={self.cp_backend} requires {TorchContextParallelConfig}, "
                    f"but cp_handler was set to {type(self.cp_handler)}"
                )
        if self.sp_size > 1 and self.sp_handler is None:  # type: ignore[operator]
            self.sp_handler = DeepSpeedSequenceParallelConfig()

    def _check_sizes(self) -> None:
        for name in ("dp_replicate", "dp_shard", "tp", "cp"):
            if getattr(self, f"{name}_size") < 1:
                raise ValueError(f"{name}_size must be at least 1, but got {getattr(self, f'{name}_size')}")
        if self.cp_backend not in CP_BACKENDS:
            raise ValueError(f"cp_backend must be one of {list(CP_BACKENDS)}, but got {self.cp_backend}")
        if self.sp_size < 1:  # type: ignore[operator]
            raise ValueError(f"sp_size must be at least 1, but got {self.sp_size}")
        if self.sp_backend not in SP_BACKENDS:
            raise ValueError(f"sp_backend must be one of {list(SP_BACKENDS)}, but got {self.sp_backend}")
        if self.cp_enabled and self.sp_enabled:
            raise ValueError(
                "Context Parallelism (CP) and Sequence Parallelism (SP) are mutually exclusive. "
                f"Got cp_size={self.cp_size} and sp_size={self.sp_size}. Please set either cp_size=1 or sp_size=1."
            )
        if self.cp_enabled and self.dp_replicate_enabled and not self.dp_shard_enabled:
            raise ValueError(
                "Context parallelism (cp_size > 1) cannot be used with pure data parallelism "
                "(dp_replicate_size > 1 and dp_shard_size == 1). Please set dp_shard_size > 1 and "
                "dp_replicate_size == 1 to compose FSDP + CP for 2D parallel, or set dp_replicate_size > 1 and "
                "dp_shard_size > 1 to compose HSDP + CP for 3D parallel."
            )

    def __repr__(self) -> str:
        shown = (
            "dp_replicate_size",
            "dp_shard_size",
            "tp_size",
            "cp_size",
            "cp_backend",
            "sp_size",
            "sp_backend",
        )
        body = ", ".join(f"{name}={getattr(self, name)}" for name in shown)
        return f"ParallelismConfig({body}, total_size={self.total_size}, tp_handler={self.tp_handler}, cp_handler={self.cp_handler})"

    def to_json(self) -> dict[str, Any]:
        """The fields (handlers as dicts), without the device mesh: what a checkpoint or a log can keep."""
        return copy.deepcopy(
            {
                key: vars(value) if hasattr(value, "__dict__") else value
                for key, value in vars(self).items()
                if key != "device_mesh"
            }
        )

    # ---- which dimensions are on ------------------------------------------------------------------
    @property
    def dp_replicate_enabled(self) -> bool:
        return self.dp_replicate_size > 1  # type: ignore[operator]

    @property
    def dp_shard_enabled(self) -> bool:
        return self.dp_shard_size > 1  # type: ignore[operator]

    @property
    def tp_enabled(self) -> bool:
        return self.tp_size > 1  # type: ignore[operator]

    @property
    def cp_enabled(self) -> bool:
        return self.cp_size > 1  # type: ignore[operator]

    @property
    def sp_enabled(self) -> bool:
        return self.sp_size > 1  # type: ignore[operator]

    def _enabled(self, *names: str) -> list[str]:
        return [name for name in names if getattr(self, f"{name}_enabled")]

    @property
    def dp_dim_names(self) -> list[str]:
        """Dimensions over which data is split."""
        return self._enabled("dp_replicate", "dp_shard")

    @property
    def non_dp_dim_names(self) -> list[str]:
        """Dimensions whose ranks read the same batch."""
        return self._enabled("tp", "cp", "sp")

    @property
    def dp_shard_cp_dim_names(self) -> list[str]:
        """Dimensions flattened into the one FSDP shards parameters over."""
        return self._enabled("dp_shard", "cp")

    @property
    def dp_cp_dim_names(self) -> list[str]:
        """Dimensions over which the loss is averaged."""
        return self._enabled("dp_replicate", "dp_shard", "cp")

    @property
    def fsdp_dim_names(self) -> list[str]:
        """Dimensions FSDP is applied over (replication first, when on)."""
        return [*self._enabled("dp_replicate"), "dp_shard_cp"]

    @property
    def active_mesh_dims(self) -> list[str]:
        return self.dp_dim_names + self.non_dp_dim_names

    # ---- sizes ------------------------------------------------------------------------------------
    @property
    def total_size(self) -> int:
        return self.data_parallel_size * self.non_data_parallel_size

    @property
    def non_data_parallel_size(self) -> int:
        return self.tp_size * self.cp_size * self.sp_size  # type: ignore[operator]

    @property
    def data_parallel_size(self) -> int:
        return self.dp_replicate_size * self.dp_shard_size  # type: ignore[operator]

    def _get_mesh(self) -> tuple[tuple[str, ...], tuple[int, ...]] | tuple[()]:
        """(dimension names, sizes) of the enabled dimensions in mesh order; () when none is enabled."""
        names = [name for name in MESH_ORDER if name in self.active_mesh_dims]
        if not names:
            return ()
        return tuple(names), tuple(self._sizes[name] for name in names)

    def _set_size(self, parallelism: str, size: int) -> None:
        if parallelism not in self._sizes:
            raise ValueError(f"parallelism must be one of {list(self._sizes)}, got {parallelism!r}")
        self._sizes[parallelism] = size
        setattr(self, f"{parallelism}_size", size)

    # ---- meshes ------------------------------------------------------------------------------------
    def mesh_shape(self, world_size: int) -> MeshShape:
        """The sizes as the job's mesh, checked against `world_size` (pure: no process group needed)."""
        from accelerando.parallel.mesh import MeshShape

        if self.sp_enabled:
            raise ValueError(f"ParallelismConfig(sp_size={self.sp_size}): {_NO_SP}")
        sizes = {name: self._sizes[name] for name in ("dp_replicate", "dp_shard", "cp", "tp")}
        if self.total_size != world_size:
            product = " x ".join(f"{name}_size={size}" for name, size in sizes.items())
            raise ValueError(
                f"ParallelismConfig {product} = {self.total_size}, but the job has {world_size} "
                f"process{'es' if world_size != 1 else ''}; the sizes must multiply to the number of processes"
            )
        return MeshShape.resolve(world_size, **sizes)

    def build_device_mesh(self, device_type: str) -> Any:
        """The `DeviceMesh` over dp_replicate, dp_shard, cp, tp (every dimension, size 1 included) with
        `dp`, `dp_shard_cp` and `dp_cp` flattened; collective: every rank must call it."""
        import torch.distributed as dist

        from accelerando.parallel.mesh import ParallelMesh

        if not dist.is_initialized():
            raise RuntimeError(
                "ParallelismConfig.build_device_mesh needs the process group: create the Accelerator first"
            )
        shape = self.mesh_shape(dist.get_world_size())
        return ParallelMesh(shape, dist.get_rank(), device_type).build()

    def get_device_mesh(self, device_type: str | None = None) -> Any:
        if self.device_mesh is None:
            if device_type is None:
                raise ValueError("You need to pass a device_type e.g cuda to build the device mesh")
            self.device_mesh = self.build_device_mesh(device_type)
        return self.device_mesh

    def _validate_accelerator(self, accelerator: Any) -> None:
        """Refuse sizes that do not fit the accelerator's processes or strategy; warn about unused handlers."""
        if not accelerator.multi_device and self.total_size == 1:
            return
        if self.total_size == 1:
            self._set_size("dp_replicate", accelerator.num_processes)
        deepspeed_sp = self.sp_backend == "deepspeed" and self.sp_enabled
        if not deepspeed_sp and self.total_size != accelerator.num_processes:
            raise ValueError(
                f"ParallelismConfig total_size ({self.total_size}) does not match num_processes "
                f"({accelerator.num_processes}). Please adjust dp_replicate_size/dp_shard_size/tp_size/cp_size/sp_size."
            )
        if accelerator.is_fsdp2 and not self.dp_shard_enabled and not self.cp_enabled:
            raise ValueError(
                "FSDP is enabled but the parallelism config has no dimension for FSDP to shard across (both "
                "`dp_shard_size` and `cp_size` are 1): raise dp_shard_size, or launch without the FSDP config."
            )
        deepspeed = str(accelerator.distributed_type) == str(DistributedType.DEEPSPEED)
        if self.total_size > 1 and not (accelerator.is_fsdp2 or accelerator.multi_device or deepspeed):
            raise ValueError(
                "ParallelismConfig is only compatible DistributedType.FSDP (version 2) or "
                f"DistributedType.Multi{{Device}} or DistributedType.DEEPSPEED, but got {accelerator.distributed_type}."
            )
        unused = sorted(
            f"ParallelismConfig.{name}_handler is set, but {name}_size is set to 1. This handler will be ignored."
            for name, size in self._sizes.items()
            if size == 1 and getattr(self, f"{name}_handler", None) is not None
        )
        if unused and accelerator.is_main_process:
            warnings.warn("ParallelismConfig has the following warnings:\n" + "\n".join(unused), stacklevel=2)


@dataclass
class TorchTensorParallelPlugin:
    """Accelerate's deprecated form of `ParallelismConfig(tp_size=...)`, kept so that code passing
    `Accelerator(torch_tp_plugin=...)` still runs; `torch_device_mesh` is ignored, as in Accelerate."""

    tp_size: int = 1
    torch_device_mesh: Any = None


def parallelism_from_tp_plugin(plugin: Any, given: ParallelismConfig | None) -> ParallelismConfig | None:
    """`Accelerator(torch_tp_plugin=...)`: a FutureWarning, then `ParallelismConfig(tp_size=plugin.tp_size)`
    unless a ParallelismConfig was passed too (then its tp_size must agree)."""
    if plugin is None:
        return given
    if not isinstance(plugin, TorchTensorParallelPlugin):
        raise TypeError(f"torch_tp_plugin must be a TorchTensorParallelPlugin, got {type(plugin).__name__}")
    warnings.warn(
        "TorchTensorParallelPlugin is deprecated (Accelerate 1.x); pass "
        f"parallelism_config=ParallelismConfig(tp_size={plugin.tp_size}) instead",
        FutureWarning,
        stacklevel=4,
    )
    if given is None:
        return ParallelismConfig(tp_size=plugin.tp_size)
    if isinstance(given, ParallelismConfig) and given.tp_size != plugin.tp_size:
        raise ValueError(
            f"torch_tp_plugin.tp_size={plugin.tp_size} contradicts parallelism_config.tp_size={given.tp_size}; "
            "pass the size in parallelism_config only"
        )
    return given


def _default_size(value: int | None, name: str) -> int:
    return _int_setting(name, 1) if value is None else value


__all__ = [
    "DeepSpeedSequenceParallelConfig",
    "ParallelismConfig",
    "TorchContextParallelConfig",
    "TorchTensorParallelConfig",
    "TorchTensorParallelPlugin",
]
