"""`FullyShardedDataParallelPlugin`: Accelerate's FSDP settings, resolved to what FSDP2 does.

FSDP2 (`torch.distributed.fsdp.fully_shard`) is the only implementation. Settings from the FSDP1
era are translated to their FSDP2 meaning (FULL_SHARD -> reshard after forward, SHARD_GRAD_OP ->
keep parameters gathered until backward, HYBRID_SHARD -> a 2-D mesh) or refused with the reason;
a setting that has no effect under FSDP2 warns once. Values left as None are read from the `FSDP_*`
variables that `accelerando launch` (or `accelerate launch`) exports, through `config.env` only.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

import torch

from accelerando.config import env

SHARDED_STATE_DICT = "SHARDED_STATE_DICT"
FULL_STATE_DICT = "FULL_STATE_DICT"
WRAP_POLICIES = ("transformer_based_wrap", "size_based_wrap", "no_wrap")
SHARDING_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2")
BACKWARD_PREFETCH = ("BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH")
_DTYPES = {"fp32": torch.float32, "no": None, "bf16": torch.bfloat16, "fp16": torch.float16}
_WARNED: set[str] = set()

# Plugin field -> the FSDP_* variable the launcher exports for it, and how to parse it.
ENV_FIELDS: dict[str, tuple[str, str]] = {
    "fsdp_version": ("FSDP_VERSION", "int"),
    "sharding_strategy": ("FSDP_SHARDING_STRATEGY", "str"),
    "reshard_after_forward": ("FSDP_RESHARD_AFTER_FORWARD", "str"),
    "backward_prefetch": ("FSDP_BACKWARD_PREFETCH", "str"),
    "auto_wrap_policy": ("FSDP_AUTO_WRAP_POLICY", "str"),
    "transformer_cls_names_to_wrap": ("FSDP_TRANSFORMER_CLS_TO_WRAP", "str"),
    "min_num_params": ("FSDP_MIN_NUM_PARAMS", "int"),
    "cpu_offload": ("FSDP_OFFLOAD_PARAMS", "bool"),
    "state_dict_type": ("FSDP_STATE_DICT_TYPE", "str"),
    "use_orig_params": ("FSDP_USE_ORIG_PARAMS", "bool"),
    "sync_module_states": ("FSDP_SYNC_MODULE_STATES", "bool"),
    "forward_prefetch": ("FSDP_FORWARD_PREFETCH", "bool"),
    "activation_checkpointing": ("FSDP_ACTIVATION_CHECKPOINTING", "bool"),
    "ignored_modules": ("FSDP_IGNORED_MODULES", "str"),
    "cpu_ram_efficient_loading": ("FSDP_CPU_RAM_EFFICIENT_LOADING", "bool"),
}

# `fsdp_config` keys of an Accelerate YAML file -> the variable each one becomes.
YAML_KEYS: dict[str, str] = {
    "fsdp_version": "FSDP_VERSION",
    "fsdp_sharding_strategy": "FSDP_SHARDING_STRATEGY",
    "fsdp_reshard_after_forward": "FSDP_RESHARD_AFTER_FORWARD",
    "fsdp_backward_prefetch": "FSDP_BACKWARD_PREFETCH",
    "fsdp_auto_wrap_policy": "FSDP_AUTO_WRAP_POLICY",
    "fsdp_transformer_layer_cls_to_wrap": "FSDP_TRANSFORMER_CLS_TO_WRAP",
    "fsdp_min_num_params": "FSDP_MIN_NUM_PARAMS",
    "fsdp_offload_params": "FSDP_OFFLOAD_PARAMS",
    "fsdp_state_dict_type": "FSDP_STATE_DICT_TYPE",
    "fsdp_use_orig_params": "FSDP_USE_ORIG_PARAMS",
    "fsdp_sync_module_states": "FSDP_SYNC_MODULE_STATES",
    "fsdp_forward_prefetch": "FSDP_FORWARD_PREFETCH",
    "fsdp_activation_checkpointing": "FSDP_ACTIVATION_CHECKPOINTING",
    "fsdp_ignored_modules": "FSDP_IGNORED_MODULES",
    "fsdp_cpu_ram_efficient_loading": "FSDP_CPU_RAM_EFFICIENT_LOADING",
}
# Keys that Accelerate renamed; each gets an error naming the new key.
RENAMED_YAML_KEYS = {"fsdp_backward_prefetch_policy": "fsdp_backward_prefetch"}


def warn_once(message: str) -> None:
    """A setting without effect is worth one warning per process, not one per step or per rank call."""
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, UserWarning, stacklevel=3)


def enable_fsdp_ram_efficient_loading() -> None:
    """Tell `transformers.from_pretrained` (which reads these variables) to load real weights on rank 0
    only and build the model on the meta device elsewhere; call before loading the model."""
    env.export({"ACCELERATE_USE_FSDP": "true", "FSDP_CPU_RAM_EFFICIENT_LOADING": "true"})


def disable_fsdp_ram_efficient_loading() -> None:
    """Every rank loads real weights again in `from_pretrained`."""
    env.export({"FSDP_CPU_RAM_EFFICIENT_LOADING": "false"})


def fsdp_config_to_env(config: Mapping[str, Any]) -> dict[str, str]:
    """Validate a YAML `fsdp_config` section and return the `FSDP_*` variables it stands for.

    Pure: the launcher exports the result. Unknown and renamed keys are errors that name the fix.
    """
    out: dict[str, str] = {}
    for key, value in config.items():
        if key in RENAMED_YAML_KEYS:
            raise ValueError(
                f"fsdp_config key {key!r} was renamed in Accelerate 1.0; use {RENAMED_YAML_KEYS[key]!r}"
            )
        if key not in YAML_KEYS:
            raise ValueError(f"unknown fsdp_config key {key!r}; accepted: {', '.join(YAML_KEYS)}")
        if value is None:
            continue
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, (list, tuple)):
            text = ",".join(str(v) for v in value)
        else:
            text = str(value)
        out[YAML_KEYS[key]] = text
    check_settings(out)  # parse once so a bad value fails where the file is read
    return out


def settings_from_env(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Plugin fields set by the launcher's `FSDP_*` variables (only those present), parsed."""
    found: dict[str, Any] = {}
    for field_name, (var, kind) in ENV_FIELDS.items():
        value = env.raw(var, environ)
        if value is None or value.strip() == "":
            continue
        if kind == "bool":
            found[field_name] = env.parse_bool(value, var)
        elif kind == "int":
            try:
                found[field_name] = int(value)
            except ValueError:
                raise ValueError(f"environment variable {var}={value!r} is not an integer") from None
        else:
            found[field_name] = value.strip()
    return found


def check_settings(environ: Mapping[str, str]) -> None:
    """Parse `FSDP_*` values exactly as the plugin will in each process, so a bad one fails before launch.

    Pure (reads only `environ`); errors name the setting and what is accepted.
    """
    found = settings_from_env(environ)
    for name, value in found.items():
        check = _FIELD_CHECKS.get(name)
        if check is not None:
            check(value)
    _check_ram_efficient_loading(found.get("cpu_ram_efficient_loading"), found.get("sync_module_states"))


def _check_version(value: Any) -> None:
    if str(value) not in ("1", "2"):
        raise ValueError(f"fsdp_version must be 1 or 2, got {value!r}")


def _check_backward_prefetch(value: Any) -> str:
    name = _enum_name(value)
    if name not in BACKWARD_PREFETCH:
        raise ValueError(f"backward_prefetch {name!r} unknown; accepted: {', '.join(BACKWARD_PREFETCH)}")
    return name


def _check_min_num_params(value: Any) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
        raise ValueError(f"min_num_params must be a non-negative integer, got {value!r}")


def _check_ignored_modules(value: Any) -> None:
    if isinstance(value, str):
        try:
            re.compile(value)
        except re.error as err:
            raise ValueError(
                f"ignored_modules {value!r} is not a regular expression over module names: {err}"
            ) from None


def _check_ram_efficient_loading(cpu_ram_efficient_loading: Any, sync_module_states: Any) -> None:
    if cpu_ram_efficient_loading and sync_module_states is False:
        raise ValueError(
            "cpu_ram_efficient_loading=True needs sync_module_states=True: ranks other than 0 hold no "
            "weights and receive rank 0's"
        )


def _enum_name(value: Any) -> str:
    """FSDP1 enums (ShardingStrategy.FULL_SHARD), their int values as env strings, or plain names."""
    name = getattr(value, "name", value)
    return str(name).strip().upper()


def _reshard_from_strategy(name: str) -> tuple[bool, bool]:
    """(reshard_after_forward, hybrid) for an FSDP1 sharding strategy name or its 1-based index."""
    if name.isdigit() and 1 <= int(name) <= len(SHARDING_STRATEGIES):
        name = SHARDING_STRATEGIES[int(name) - 1]
    if name == "NO_SHARD":
        raise ValueError(
            "sharding_strategy='NO_SHARD' has no FSDP2 form: it is plain data parallelism. "
            "Drop --use_fsdp (accelerando uses DistributedDataParallel), or use FULL_SHARD/SHARD_GRAD_OP"
        )
    if name not in SHARDING_STRATEGIES:
        raise ValueError(f"unknown sharding_strategy {name!r}; accepted: {', '.join(SHARDING_STRATEGIES)}")
    return name in ("FULL_SHARD", "HYBRID_SHARD"), name.startswith("HYBRID")


def _parse_reshard(value: Any) -> tuple[bool | int, bool]:
    """FSDP2 accepts a bool (or an int group size); FSDP1 configs carry a strategy name here."""
    if isinstance(value, bool) or (isinstance(value, int) and not isinstance(value, bool)):
        return value, False
    text = _enum_name(value)
    if text.lower() in ("true", "false", "1", "0", "yes", "no"):
        return env.parse_bool(text, "reshard_after_forward"), False
    return _reshard_from_strategy(text)


def parse_mixed_precision(value: Any) -> Any:
    """A `MixedPrecisionPolicy` from a policy, an FSDP1 `MixedPrecision`, a dict or "bf16"/"fp16"/"fp32".

    Parameters are gathered in `param_dtype`, gradients reduced in float32 and outputs returned in
    float32; the sharded (master) parameters keep the dtype the model was created in.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if value is None or isinstance(value, MixedPrecisionPolicy):
        return value
    if isinstance(value, str):
        if value not in _DTYPES:
            raise ValueError(f"mixed_precision_policy {value!r} is not one of {', '.join(_DTYPES)}")
        dtype = _DTYPES[value]
        if dtype is None or dtype == torch.float32:
            return None
        return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32, output_dtype=torch.float32)
    if isinstance(value, Mapping):
        allowed = {"param_dtype", "reduce_dtype", "output_dtype", "cast_forward_inputs", "buffer_dtype"}
        unknown = set(value) - allowed
        if unknown:
            raise ValueError(
                f"mixed_precision_policy keys {sorted(unknown)} unknown; accepted: {sorted(allowed)}"
            )
        kwargs: dict[str, Any] = {
            k: _dtype(v) if k.endswith("dtype") else v for k, v in value.items() if k != "buffer_dtype"
        }
        if "buffer_dtype" in value:
            warn_once("mixed_precision_policy buffer_dtype has no effect under FSDP2 (buffers are not cast)")
        return MixedPrecisionPolicy(**kwargs)
    if type(value).__name__ == "MixedPrecision":  # FSDP1's class: same meaning, other home
        return parse_mixed_precision(
            {
                "param_dtype": value.param_dtype,
                "reduce_dtype": value.reduce_dtype,
                "cast_forward_inputs": True,
            }
        )
    raise TypeError(
        "mixed_precision_policy must be a MixedPrecisionPolicy, dict, or one of "
        f"{', '.join(_DTYPES)}; got {type(value).__name__}"
    )


def _dtype(value: Any) -> torch.dtype | None:
    if value is None or isinstance(value, torch.dtype):
        return value
    if isinstance(value, str):
        if value in _DTYPES:
            return _DTYPES[value] or torch.float32
        dtype = getattr(torch, value.replace("torch.", ""), None)
        if isinstance(dtype, torch.dtype):
            return dtype
    raise ValueError(f"{value!r} is not a dtype; use torch.bfloat16 or 'bf16', 'fp16', 'fp32'")


def _parse_offload(value: Any) -> Any:
    """`CPUOffloadPolicy` (pinned memory only where an accelerator exists) from bool or FSDP1 CPUOffload."""
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

    if isinstance(value, OffloadPolicy):
        return value if type(value) is not OffloadPolicy else None
    if type(value).__name__ == "CPUOffload":
        value = bool(value.offload_params)
    if not isinstance(value, bool):
        raise TypeError(f"cpu_offload must be a bool or CPUOffloadPolicy, got {value!r}")
    if not value:
        return None
    return CPUOffloadPolicy(pin_memory=torch.accelerator.is_available())


def _parse_state_dict_type(value: Any) -> str:
    text = _enum_name(value)
    if text in ("SHARDED", SHARDED_STATE_DICT, "3"):
        return SHARDED_STATE_DICT
    if text in ("FULL", FULL_STATE_DICT, "1"):
        return FULL_STATE_DICT
    if text in ("LOCAL_STATE_DICT", "LOCAL", "2"):
        raise ValueError(
            "state_dict_type LOCAL_STATE_DICT is FSDP1's flat-parameter format and has no FSDP2 form; "
            "use SHARDED_STATE_DICT (per-rank DTensor shards, resharded on load)"
        )
    raise ValueError(f"state_dict_type {value!r} unknown; accepted: {SHARDED_STATE_DICT}, {FULL_STATE_DICT}")


def _parse_wrap_policy(value: Any) -> str | Callable[..., Any] | None:
    if value is None or callable(value):
        return value
    text = str(value).strip().lower()
    if text not in WRAP_POLICIES:
        raise ValueError(
            f"auto_wrap_policy {value!r} unknown; accepted: a callable or {', '.join(WRAP_POLICIES)}"
        )
    return text


def _parse_names(value: Any) -> list[str] | None:
    if value is None:
        return None
    items = value.split(",") if isinstance(value, str) else list(value)
    names = [str(v).strip() for v in items if str(v).strip()]
    return names or None


def get_module_class_from_name(module: torch.nn.Module, name: str) -> type[torch.nn.Module] | None:
    """The class called `name` of `module` or of one of its submodules (depth first), else None."""
    for sub in module.modules():
        if type(sub).__name__ == name:
            return type(sub)
    return None


# Plugin field -> the check `check_settings` runs on a launcher-given value (the plugin's own parsers).
_FIELD_CHECKS: dict[str, Callable[[Any], object]] = {
    "fsdp_version": _check_version,
    "sharding_strategy": lambda value: _reshard_from_strategy(_enum_name(value)),
    "reshard_after_forward": _parse_reshard,
    "backward_prefetch": _check_backward_prefetch,
    "auto_wrap_policy": _parse_wrap_policy,
    "state_dict_type": _parse_state_dict_type,
    "min_num_params": _check_min_num_params,
    "ignored_modules": _check_ignored_modules,
}


@dataclass
class FullyShardedDataParallelPlugin:
    """Accelerate's FSDP plugin, implemented with FSDP2. See docs/fsdp.md for each field."""

    fsdp_version: int | None = None
    sharding_strategy: Any = None
    reshard_after_forward: Any = None
    backward_prefetch: Any = None
    mixed_precision_policy: Any = None
    auto_wrap_policy: Any = None
    cpu_offload: Any = None
    ignored_modules: Iterable[torch.nn.Module] | str | None = None
    state_dict_type: Any = None
    state_dict_config: Any = None
    optim_state_dict_config: Any = None
    limit_all_gathers: bool = True
    use_orig_params: bool | None = None
    param_init_fn: Callable[[torch.nn.Module], None] | None = None
    sync_module_states: bool | None = None
    forward_prefetch: bool | None = None
    activation_checkpointing: bool | None = None
    cpu_ram_efficient_loading: bool | None = None
    transformer_cls_names_to_wrap: list[str] | str | None = None
    min_num_params: int | None = None
    verbose: bool = False

    def __post_init__(self) -> None:
        for name, value in settings_from_env().items():
            if getattr(self, name) is None:
                setattr(self, name, value)
        self._hybrid = False
        self._resolve_version_and_sharding()
        self._resolve_fsdp1_options()
        self.mixed_precision_policy = parse_mixed_precision(self.mixed_precision_policy)
        self.auto_wrap_policy = _parse_wrap_policy(self.auto_wrap_policy)
        self.cpu_offload = _parse_offload(
            bool(self.cpu_offload) if self.cpu_offload is None else self.cpu_offload
        )
        self.set_state_dict_type(self.state_dict_type)
        self.transformer_cls_names_to_wrap = _parse_names(self.transformer_cls_names_to_wrap)
        _check_min_num_params(self.min_num_params)
        _check_ignored_modules(self.ignored_modules)
        self.activation_checkpointing = bool(self.activation_checkpointing)
        self.cpu_ram_efficient_loading = bool(self.cpu_ram_efficient_loading)
        _check_ram_efficient_loading(self.cpu_ram_efficient_loading, self.sync_module_states)
        self.sync_module_states = bool(self.sync_module_states) or self.cpu_ram_efficient_loading

    def _resolve_version_and_sharding(self) -> None:
        version = 2 if self.fsdp_version is None else self.fsdp_version
        _check_version(version)
        if int(version) == 1:
            warn_once(
                "fsdp_version=1: accelerando implements FSDP with FSDP2 (fully_shard); FSDP1 settings are "
                "translated to their FSDP2 meaning (see docs/fsdp.md)"
            )
        self.fsdp_version = 2
        reshard: bool | int = True
        if self.sharding_strategy is not None:
            reshard, self._hybrid = _reshard_from_strategy(_enum_name(self.sharding_strategy))
        if self.reshard_after_forward is not None:
            explicit, hybrid = _parse_reshard(self.reshard_after_forward)
            if self.sharding_strategy is not None and explicit != reshard:
                warn_once(
                    f"sharding_strategy={_enum_name(self.sharding_strategy)} and reshard_after_forward="
                    f"{self.reshard_after_forward!r} disagree; reshard_after_forward (the FSDP2 setting) wins"
                )
            reshard, self._hybrid = explicit, self._hybrid or hybrid
        self.reshard_after_forward = reshard

    def _resolve_fsdp1_options(self) -> None:
        if self.backward_prefetch is not None:
            name = _check_backward_prefetch(self.backward_prefetch)
            if name != "BACKWARD_PRE":
                warn_once(
                    f"backward_prefetch={name} has no effect: FSDP2 always prefetches the next block's "
                    "all-gather before its backward (FSDP1's BACKWARD_PRE)"
                )
            self.backward_prefetch = name
        if self.use_orig_params is False:
            warn_once("use_orig_params=False has no effect: FSDP2 always keeps the original parameters")
        if not self.limit_all_gathers:
            warn_once("limit_all_gathers=False has no effect: FSDP2 bounds in-flight all-gathers itself")
        for name in ("state_dict_config", "optim_state_dict_config"):
            if getattr(self, name) is not None:
                warn_once(
                    f"{name} has no effect under FSDP2: full state dicts are gathered to rank 0 on CPU, "
                    "sharded ones stay DTensors"
                )
        self.forward_prefetch = bool(self.forward_prefetch)

    @property
    def hybrid_shard(self) -> bool:
        """HYBRID_SHARD: shard within a node, replicate across nodes (a 2-D device mesh)."""
        return self._hybrid

    def set_state_dict_type(self, state_dict_type: Any = None) -> None:
        """SHARDED_STATE_DICT (default: every rank writes its shards) or FULL_STATE_DICT (rank 0)."""
        self.state_dict_type = _parse_state_dict_type(state_dict_type or SHARDED_STATE_DICT)

    def set_auto_wrap_policy(self, model: torch.nn.Module) -> None:
        """Check the wrap policy against `model` now, as Accelerate's method of this name does.

        Accelerate builds its policy callable here; accelerando plans the units at `prepare`, so
        this only fills what Accelerate fills: with TRANSFORMER_BASED_WRAP and no class names, the
        model's `_no_split_modules` that it contains; a named class the model lacks is an error.
        """
        if self.auto_wrap_policy != "transformer_based_wrap":
            return
        if self.transformer_cls_names_to_wrap is None:
            declared = list(getattr(model, "_no_split_modules", None) or [])
            present = [name for name in declared if get_module_class_from_name(model, name) is not None]
            self.transformer_cls_names_to_wrap = present or None
        for name in self.transformer_cls_names_to_wrap or []:
            if get_module_class_from_name(model, name) is None:
                raise ValueError(
                    f"Could not find the transformer layer class {name} in the model "
                    f"({type(model).__name__}); transformer_cls_names_to_wrap names classes of its submodules"
                )

    def set_mixed_precision(
        self, mixed_precision: Any, buffer_autocast: bool = False, override: bool = False
    ) -> None:
        """Fill the policy from the Accelerator's mixed precision unless one was given (or `override`)."""
        if self.mixed_precision_policy is None or override:
            self.mixed_precision_policy = parse_mixed_precision(mixed_precision)

    def ignored_parameters(self, model: torch.nn.Module) -> set[torch.nn.Parameter]:
        """Parameters of `ignored_modules` (module objects, or a regex over module names)."""
        import re

        if self.ignored_modules is None:
            return set()
        if isinstance(self.ignored_modules, str):
            pattern = re.compile(self.ignored_modules)
            modules = [m for n, m in model.named_modules() if n and pattern.fullmatch(n)]
        else:
            modules = list(self.ignored_modules)
        return {p for m in modules for p in m.parameters()}

    def describe(self) -> dict[str, Any]:
        """Field -> value, for logging and tests."""
        return {f.name: getattr(self, f.name) for f in fields(self)}
