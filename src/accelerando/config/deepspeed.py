"""`DeepSpeedPlugin`: Accelerate's DeepSpeed settings, turned into one DeepSpeed config per plugin.

A plugin either starts from a DeepSpeed config (`hf_ds_config`: a dict, a JSON path or an
`HfDeepSpeedConfig`) or synthesizes one from its fields. A field given together with a config file
must agree with the file's value (or fill the file's `"auto"`); a disagreement is an error naming
both values, never a silent choice. Fields left as None are read from the variables that
`accelerando launch` (or `accelerate launch`) exports, through `config.env` only. Values the
Accelerator knows (accumulation steps, precision, the loaders' batch size) fill the remaining
`"auto"` entries: precision and accumulation when the Accelerator is built (`reconcile`), the batch
size when each engine is built (`strategies/deepspeed_config.py`).
This module does not import deepspeed: it is configuration only.
"""

from __future__ import annotations

import contextlib
import copy
import json
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accelerando.config import env

AUTO = "auto"
OFFLOAD_DEVICES = ("none", "cpu", "nvme")
ZERO_STAGES = (0, 1, 2, 3)
DEFAULT_ZERO_STAGE = 2  # Accelerate's default when neither a field, a variable nor a file says

# Plugin field -> (DeepSpeed config key, launcher variable without the ACCELERANDO_/ACCELERATE_ prefix).
FIELDS: dict[str, tuple[str, str]] = {
    "gradient_accumulation_steps": ("gradient_accumulation_steps", "GRADIENT_ACCUMULATION_STEPS"),
    "gradient_clipping": ("gradient_clipping", "GRADIENT_CLIPPING"),
    "zero_stage": ("zero_optimization.stage", "DEEPSPEED_ZERO_STAGE"),
    "offload_optimizer_device": ("zero_optimization.offload_optimizer.device", "DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE"),
    "offload_param_device": ("zero_optimization.offload_param.device", "DEEPSPEED_OFFLOAD_PARAM_DEVICE"),
    "offload_optimizer_nvme_path": (
        "zero_optimization.offload_optimizer.nvme_path",
        "DEEPSPEED_OFFLOAD_OPTIMIZER_NVME_PATH",
    ),
    "offload_param_nvme_path": ("zero_optimization.offload_param.nvme_path", "DEEPSPEED_OFFLOAD_PARAM_NVME_PATH"),
    "zero3_save_16bit_model": (
        "zero_optimization.stage3_gather_16bit_weights_on_model_save",
        "DEEPSPEED_ZERO3_SAVE_16BIT_MODEL",
    ),
}  # fmt: skip
_KINDS = {
    "gradient_accumulation_steps": "int",
    "gradient_clipping": "float",
    "zero_stage": "int",
    "zero3_save_16bit_model": "bool",
}


class HfDeepSpeedConfig:
    """A DeepSpeed config (dict or JSON file) with dotted-key access (`"zero_optimization.stage"`)."""

    def __init__(self, config_file_or_dict: Any) -> None:
        if isinstance(config_file_or_dict, HfDeepSpeedConfig):
            config: Any = copy.deepcopy(config_file_or_dict.config)
        elif isinstance(config_file_or_dict, Mapping):
            config = copy.deepcopy(dict(config_file_or_dict))
        elif isinstance(config_file_or_dict, (str, Path)):
            config = _read_json(Path(config_file_or_dict))
        else:
            raise TypeError(
                "hf_ds_config must be a dict, a path to a DeepSpeed JSON file or an HfDeepSpeedConfig, "
                f"got {type(config_file_or_dict).__name__}"
            )
        self.config: dict[str, Any] = config

    def find_config_node(self, ds_key_long: str) -> tuple[dict[str, Any] | None, str]:
        """The dict holding the last part of `ds_key_long`, and that part (None when a parent is missing)."""
        node: Any = self.config
        *parents, key = ds_key_long.split(".")
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
            if node is None:
                return None, key
        return (node if isinstance(node, dict) else None), key

    def get_value(self, ds_key_long: str, default: Any = None) -> Any:
        node, key = self.find_config_node(ds_key_long)
        return default if node is None else node.get(key, default)

    def set_value(self, ds_key_long: str, value: Any) -> None:
        node: dict[str, Any] = self.config
        *parents, key = ds_key_long.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[key] = value

    def del_config_sub_tree(self, ds_key_long: str, must_exist: bool = False) -> None:
        node, key = self.find_config_node(ds_key_long)
        if node is None or key not in node:
            if must_exist:
                raise ValueError(f"DeepSpeed config has no {ds_key_long!r}")
            return
        del node[key]

    def is_true(self, ds_key_long: str) -> bool:
        value = self.get_value(ds_key_long)
        return value is not None and bool(value) and value != AUTO

    def is_false(self, ds_key_long: str) -> bool:
        value = self.get_value(ds_key_long)
        return value is not None and value != AUTO and not bool(value)

    @property
    def stage(self) -> int | None:
        value = self.get_value("zero_optimization.stage")
        return None if value in (None, AUTO) else int(value)

    def is_zero2(self) -> bool:
        return self.stage == 2

    def is_zero3(self) -> bool:
        return self.stage == 3

    def is_offload(self) -> bool:
        devices = (
            self.get_value("zero_optimization.offload_optimizer.device"),
            self.get_value("zero_optimization.offload_param.device"),
        )
        return any(d in ("cpu", "nvme") for d in devices)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.expanduser().read_text())
    except OSError as err:
        raise ValueError(f"cannot read the DeepSpeed config file {str(path)!r}: {err.strerror}") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"the DeepSpeed config file {str(path)!r} is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"the DeepSpeed config file {str(path)!r} must hold a JSON object")
    return data


def settings_from_env(variables: Mapping[str, str] | None = None) -> dict[str, Any]:
    """DeepSpeedPlugin arguments from the launcher's variables (`os.environ` when None), parsed."""
    out: dict[str, Any] = {}
    for name, (_, variable) in FIELDS.items():
        value = env.lookup(variable, variables)
        if value:
            out[name] = _parse(name, value, env.PREFIX + variable)
    config_file = env.lookup("DEEPSPEED_CONFIG_FILE", variables)
    if config_file and config_file != "none":
        out["hf_ds_config"] = config_file
    zero3_init = env.lookup("DEEPSPEED_ZERO3_INIT", variables)
    if zero3_init:
        out["zero3_init_flag"] = env.parse_bool(zero3_init, env.PREFIX + "DEEPSPEED_ZERO3_INIT")
    moe = env.lookup("DEEPSPEED_MOE_LAYER_CLS_NAMES", variables)
    if moe:
        out["transformer_moe_cls_names"] = moe
    return out


def check_settings(
    variables: Mapping[str, str],
    *,
    mixed_precision: str,
    precision_from: str | None,
    accumulation_from: str | None,
) -> None:
    """What every process will do with these launcher variables, done once before any process starts."""
    plugin = DeepSpeedPlugin(**settings_from_env(variables))
    steps = env.integer("GRADIENT_ACCUMULATION_STEPS", 1, variables) or 1
    reconcile(
        {"default": plugin},
        mixed_precision=mixed_precision,
        precision_from=precision_from,
        gradient_accumulation_steps=steps,
        accumulation_from=accumulation_from,
    )


def _parse(name: str, value: Any, where: str) -> Any:
    """A field's value in its type; `"auto"` stays as is (the Accelerator fills it)."""
    if value is None or value == AUTO:
        return value
    kind = _KINDS.get(name, "str")
    try:
        if kind == "int":
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)
        if kind == "float":
            return float(value)
        if kind == "bool":
            return value if isinstance(value, bool) else env.parse_bool(str(value), where)
    except ValueError:
        raise ValueError(f"{where}: {value!r} is not a valid {kind} for {name}") from None
    text = str(value)
    return text.lower() if name.endswith("_device") else text


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b) or float(a) == float(b)
    except (TypeError, ValueError):
        return False


@dataclass
class DeepSpeedPlugin:
    """Accelerate's DeepSpeed settings (see docs/deepspeed.md); one plugin per DeepSpeed engine kind."""

    hf_ds_config: Any = None
    gradient_accumulation_steps: Any = None
    gradient_clipping: Any = None
    zero_stage: Any = None
    is_train_batch_min: bool = True
    offload_optimizer_device: str | None = None
    offload_param_device: str | None = None
    offload_optimizer_nvme_path: str | None = None
    offload_param_nvme_path: str | None = None
    zero3_init_flag: bool | None = None
    zero3_save_16bit_model: bool | None = None
    transformer_moe_cls_names: str | None = None
    deepspeed_config: dict[str, Any] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        for name, value in settings_from_env().items():
            if getattr(self, name) is None:
                setattr(self, name, value)
        for name in FIELDS:
            setattr(self, name, _parse(name, getattr(self, name), f"DeepSpeedPlugin({name}=...)"))
        if self.offload_optimizer_device is not None and self.offload_optimizer_device not in OFFLOAD_DEVICES:
            raise ValueError(
                f"offload_optimizer_device={self.offload_optimizer_device!r}; accepted: {', '.join(OFFLOAD_DEVICES)}"
            )
        if self.offload_param_device is not None and self.offload_param_device not in OFFLOAD_DEVICES:
            raise ValueError(
                f"offload_param_device={self.offload_param_device!r}; accepted: {', '.join(OFFLOAD_DEVICES)}"
            )
        if self.hf_ds_config not in (None, "", "none"):
            self.hf_ds_config = HfDeepSpeedConfig(self.hf_ds_config)
            self._merge_fields_into_file()
        else:
            self.hf_ds_config = HfDeepSpeedConfig(self._synthesized())
        self.deepspeed_config = self.hf_ds_config.config
        self.deepspeed_config.setdefault("steps_per_print", 10**12)  # DeepSpeed logs every 10 steps otherwise
        stage = self.hf_ds_config.stage
        if stage is not None and stage not in ZERO_STAGES:
            raise ValueError(f"zero_optimization.stage={stage} is not one of 0, 1, 2, 3")
        if self.zero3_init_flag is None:
            flag = env.lookup("DEEPSPEED_ZERO3_INIT")
            self.zero3_init_flag = (
                env.parse_bool(flag, env.PREFIX + "DEEPSPEED_ZERO3_INIT")
                if flag
                else self.hf_ds_config.is_zero3()
            )
        if self.zero3_init_flag and not self.hf_ds_config.is_zero3():
            warnings.warn(
                f"DeepSpeedPlugin(zero3_init_flag=True) has no effect with ZeRO stage {stage}: it builds ZeRO-3 "
                "models partitioned; ignored",
                UserWarning,
                stacklevel=2,
            )
            self.zero3_init_flag = False
        self._selected = False
        self.dschf: Any = None

    def _synthesized(self) -> dict[str, Any]:
        """The config Accelerate writes when no file is given: the fields, "auto" for the rest."""
        stage = self.zero_stage if self.zero_stage is not None else DEFAULT_ZERO_STAGE
        self.zero_stage = stage
        zero: dict[str, Any] = {"stage": stage}
        for kind in ("optimizer", "param"):
            device = getattr(self, f"offload_{kind}_device") or "none"
            entry: dict[str, Any] = {"device": device}
            if device == "nvme":
                entry["nvme_path"] = getattr(self, f"offload_{kind}_nvme_path")
            zero[f"offload_{kind}"] = entry
        if self.zero3_save_16bit_model is not None:
            zero["stage3_gather_16bit_weights_on_model_save"] = self.zero3_save_16bit_model
        return {
            "train_batch_size": AUTO,
            "train_micro_batch_size_per_gpu": AUTO,
            "gradient_accumulation_steps": self._or_auto(self.gradient_accumulation_steps),
            "gradient_clipping": self._or_auto(self.gradient_clipping),
            "zero_optimization": zero,
        }

    @staticmethod
    def _or_auto(value: Any) -> Any:
        return AUTO if value is None else value

    def _merge_fields_into_file(self) -> None:
        """Fields fill the file's "auto" (or missing) values; a field contradicting the file is refused."""
        config = self.hf_ds_config
        if "zero_optimization" not in config.config:
            raise ValueError("the DeepSpeed config has no zero_optimization section; add one with its stage")
        for name, (key, _) in FIELDS.items():
            mine, theirs = getattr(self, name), config.get_value(key)
            if mine in (None, AUTO):
                if theirs is not None:
                    setattr(self, name, _parse(name, theirs, f"DeepSpeed config {key}"))
                continue
            if theirs in (None, AUTO):
                config.set_value(key, mine)
            elif not _same(mine, theirs):
                raise ValueError(
                    f"DeepSpeedPlugin {name}={mine!r} contradicts the DeepSpeed config's {key}={theirs!r}; "
                    'set one of them (or make the config value "auto")'
                )

    # ---- values --------------------------------------------------------------------------------
    def get_value(self, ds_key_long: str, default: Any = None) -> Any:
        return self.hf_ds_config.get_value(ds_key_long, default)

    def is_auto(self, ds_key_long: str) -> bool:
        return self.hf_ds_config.get_value(ds_key_long) == AUTO

    def fill_match(
        self, ds_key_long: str, mismatches: list[str] | None = None, must_match: bool = True, **kwargs: Any
    ) -> None:
        """Fill an "auto" value from `kwargs`; with `must_match`, record a concrete value that differs."""
        node, key = self.hf_ds_config.find_config_node(ds_key_long)
        if node is None or ds_key_long not in kwargs:
            return
        if node.get(key) == AUTO:
            node[key] = kwargs[ds_key_long]
        elif (
            must_match
            and key in node
            and not _same(node[key], kwargs[ds_key_long])
            and mismatches is not None
        ):
            mismatches.append(f"- ds {ds_key_long}={node[key]} vs arg {ds_key_long}={kwargs[ds_key_long]}")

    @property
    def stage(self) -> int:
        """The ZeRO stage the engine will run (a config without one runs stage 0, DeepSpeed's default)."""
        stage = self.hf_ds_config.stage
        return 0 if stage is None else stage

    # ---- transformers' zero.Init switch --------------------------------------------------------
    def is_zero3_init_enabled(self) -> bool:
        return bool(self.zero3_init_flag)

    def set_deepspeed_weakref(self) -> None:
        """Tell transformers (through its `HfDeepSpeedConfig`) whether to build models inside
        `deepspeed.zero.Init`: only for the selected plugin and only with zero3_init_flag."""
        if not self.zero3_init_flag:
            _unset_transformers_weakref()
            self.dschf = None
            return
        try:
            from transformers.integrations import HfDeepSpeedConfig as TransformersConfig
        except ImportError as err:
            raise ImportError(
                "DeepSpeedPlugin(zero3_init_flag=True) needs transformers: pip install transformers"
            ) from err
        config = copy.deepcopy(self.deepspeed_config)
        for key in ("gradient_accumulation_steps", "train_micro_batch_size_per_gpu"):
            if config.get(key, AUTO) == AUTO:
                config[key] = 1
        if config.get("train_batch_size") == AUTO:
            del config["train_batch_size"]
        _unset_transformers_weakref()
        self.dschf = TransformersConfig(config)  # transformers holds only a weak reference: keep it alive

    @contextlib.contextmanager
    def zero3_init_context_manager(self, enable: bool = False) -> Iterator[None]:
        """Build models with (enable=True) or without zero.Init inside this block, whatever the flag."""
        old = self.zero3_init_flag
        if old == enable:
            yield
            return
        self.zero3_init_flag = enable
        self.set_deepspeed_weakref()
        try:
            yield
        finally:
            self.zero3_init_flag = old
            if self._selected:
                self.set_deepspeed_weakref()
            else:
                _unset_transformers_weakref()
                self.dschf = None

    def select(self, _from_accelerator_state: bool = False) -> None:
        if not _from_accelerator_state:
            raise ValueError(
                "select a DeepSpeedPlugin with accelerator.state.select_deepspeed_plugin(name), not directly"
            )
        self.set_deepspeed_weakref()
        self._selected = True

    def _unselect(self) -> None:
        self._selected = False

    @property
    def selected(self) -> bool:
        return self._selected


def _unset_transformers_weakref() -> None:
    import sys

    if "transformers" not in sys.modules:
        return  # nothing can have been set: avoid importing transformers for nothing
    try:
        from transformers.integrations import unset_hf_deepspeed_config
    except ImportError:
        return
    unset_hf_deepspeed_config()


# ---- the Accelerator's values against the plugins' --------------------------------------------
def plugins_from(
    deepspeed_plugin: Any,
    deepspeed_plugins: Any,
    use_deepspeed: bool,
    variables: Mapping[str, str] | None = None,
) -> dict[str, DeepSpeedPlugin] | None:
    """The plugins by name (a single plugin is named "default"), or None without DeepSpeed; without a
    plugin argument, the launcher's `variables` make one."""
    if deepspeed_plugin is not None and deepspeed_plugins is not None:
        raise ValueError("pass either deepspeed_plugin or deepspeed_plugins to Accelerator(), not both")
    given = deepspeed_plugins if deepspeed_plugins is not None else deepspeed_plugin
    if given is None:
        return {"default": DeepSpeedPlugin(**settings_from_env(variables))} if use_deepspeed else None
    plugins = dict(given) if isinstance(given, Mapping) else {"default": given}
    if not plugins:
        raise ValueError("deepspeed_plugins is empty; give at least one DeepSpeedPlugin")
    for name, plugin in plugins.items():
        if not isinstance(plugin, DeepSpeedPlugin):
            raise TypeError(
                f"deepspeed_plugins[{name!r}] must be a DeepSpeedPlugin, got {type(plugin).__name__}"
            )
    return plugins


def reconcile(
    plugins: dict[str, DeepSpeedPlugin],
    *,
    mixed_precision: str,
    precision_from: str | None,
    gradient_accumulation_steps: int,
    accumulation_from: str | None,
) -> tuple[str, int]:
    """The Accelerator's precision and accumulation, agreed with every plugin; fills their "auto".

    `*_from` names where an explicit Accelerator value came from (None: only a default, which a
    concrete plugin value replaces). Disagreements are errors naming both values.
    """
    steps = _agree_steps(plugins, gradient_accumulation_steps, accumulation_from)
    precision = _agree_precision(plugins, mixed_precision, precision_from)
    for plugin in plugins.values():
        plugin.fill_match("gradient_accumulation_steps", gradient_accumulation_steps=steps)
        plugin.gradient_accumulation_steps = steps
        for dtype in ("fp16", "bf16"):
            if plugin.get_value(f"{dtype}.enabled") in (None, AUTO):
                plugin.hf_ds_config.set_value(f"{dtype}.enabled", _engine_dtype(precision) == dtype)
    return precision, steps


def _agree_steps(plugins: dict[str, DeepSpeedPlugin], steps: int, source: str | None) -> int:
    concrete = {
        name: int(value)
        for name, plugin in plugins.items()
        if (value := plugin.get_value("gradient_accumulation_steps")) not in (None, AUTO)
    }
    if len(set(concrete.values())) > 1:
        listed = ", ".join(f"{n!r}: {v}" for n, v in concrete.items())
        raise ValueError(
            f"the DeepSpeed plugins disagree on gradient_accumulation_steps ({listed}); one Accelerator has one "
            "accumulation window"
        )
    if not concrete:
        return steps
    (name, value), *_ = concrete.items()
    if source is not None and value != steps:
        raise ValueError(
            f"gradient_accumulation_steps={steps} ({source}) contradicts DeepSpeed plugin {name!r}'s "
            f'gradient_accumulation_steps={value}; set one of them (or "auto" in the DeepSpeed config)'
        )
    return value


def _engine_dtype(precision: str) -> str:
    """The engine's own precision: fp8 runs its fp8 GEMMs inside a bf16 engine, as Accelerate configures it."""
    return "bf16" if precision == "fp8" else precision


def _agree_precision(plugins: dict[str, DeepSpeedPlugin], precision: str, source: str | None) -> str:
    """An explicit fp16/bf16/fp8 (or an explicit 'no' argument) must match every concrete `*.enabled`."""
    found = "no"
    for name, plugin in plugins.items():
        enabled = {d: plugin.get_value(f"{d}.enabled") for d in ("fp16", "bf16")}
        on = [d for d, v in enabled.items() if v not in (None, AUTO) and bool(v)]
        if len(on) > 1:
            raise ValueError(f"DeepSpeed plugin {name!r} enables both fp16 and bf16; enable one")
        if source is not None:
            for dtype, value in enabled.items():
                if value in (None, AUTO):
                    continue
                if bool(value) != (_engine_dtype(precision) == dtype):
                    raise ValueError(
                        f"mixed_precision={precision!r} ({source}) contradicts DeepSpeed plugin {name!r}'s "
                        f'{dtype}.enabled={value}; set one of them (or "auto" in the DeepSpeed config)'
                    )
        if on and found == "no":
            found = on[0]
    return precision if source is not None else found
