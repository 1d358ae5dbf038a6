"""Accelerate-compatible config files: where they live, how they load, how they are written.

A file written by `accelerate config` loads unchanged: its nested sections (`fsdp_config`, ...) are
flattened to launch option names, `distributed_type` becomes the matching switch, legacy keys are
migrated, and keys nobody knows are reported (a warning, not an error, so newer files still load).
"""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from accelerando.config import env

CONFIG_NAME = "default_config.yaml"

# distributed_type -> the launch switch it stands for (None: nothing to switch on).
_DISTRIBUTED_TYPES: dict[str, str | None] = {
    "NO": None,
    "MULTI_CPU": "cpu",
    "MULTI_GPU": "multi_gpu",
    "MULTI_XPU": "multi_gpu",
    "MULTI_NPU": "multi_gpu",
    "MULTI_MLU": "multi_gpu",
    "MULTI_SDAA": "multi_gpu",
    "MULTI_MUSA": "multi_gpu",
    "MULTI_HPU": "multi_gpu",
    "MULTI_NEURON": "multi_gpu",
    "FSDP": "use_fsdp",
    "DEEPSPEED": "use_deepspeed",
    "XLA": "tpu",
    "TPU": "tpu",
    "MEGATRON_LM": "use_megatron_lm",
}

# Keys Accelerate writes that have no meaning for a torchrun launch: loaded silently.
_IGNORED = frozenset(
    {
        "compute_environment", "main_training_function", "downcast_bf16", "tpu_name", "tpu_zone",
        "tpu_use_cluster", "tpu_use_sudo", "command_file", "commands", "tpu_vm", "tpu_env", "ipex_config",
        "use_ipex", "megatron_lm_config", "mpirun_config", "sagemaker_inputs_file", "sagemaker_metrics_file",
    }
)  # fmt: skip
_SECTIONS = ("fsdp_config", "deepspeed_config", "dynamo_config", "fp8_config", "parallelism_config")


@dataclass(frozen=True)
class ConfigFile:
    """A loaded config file: launch option name -> value, and the key each came from."""

    path: Path
    values: dict[str, Any] = field(default_factory=dict)
    keys: dict[str, str] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict)


def cache_dir() -> Path:
    """`$HF_HOME`, else `$XDG_CACHE_HOME/huggingface`, else `~/.cache/huggingface` (Accelerate's rule)."""
    hf_home = env.raw("HF_HOME")
    if hf_home:
        return Path(hf_home).expanduser()
    xdg = env.raw("XDG_CACHE_HOME") or str(Path("~/.cache").expanduser())
    return Path(xdg).expanduser() / "huggingface"


def default_config_path() -> Path:
    """Where `accelerando config` writes: `$ACCELERANDO_CONFIG_FILE`, else `<cache_dir>/accelerando/...`."""
    override = env.config_file_override()
    if override:
        return Path(override).expanduser()
    return cache_dir() / "accelerando" / CONFIG_NAME


def accelerate_config_path() -> Path:
    """Accelerate's own default file, used when accelerando has none yet (zero-effort migration)."""
    return cache_dir() / "accelerate" / CONFIG_NAME


def find_default_config() -> Path | None:
    """The default file launch reads when no `--config_file` is given, or None."""
    ours = default_config_path()
    if ours.is_file() or env.config_file_override():
        return ours if ours.is_file() else None
    theirs = accelerate_config_path()
    return theirs if theirs.is_file() else None


def read_mapping(path: Path) -> dict[str, Any]:
    """Parse YAML or JSON (Accelerate writes JSON text into `.yaml` files) into a dict."""
    try:
        text = path.read_text()
    except OSError as err:
        raise ValueError(f"cannot read config file {str(path)!r}: {err.strerror}") from None
    loader = json.loads if path.suffix == ".json" else yaml.safe_load
    try:
        data = loader(text) if text.strip() else {}
    except (yaml.YAMLError, json.JSONDecodeError) as err:
        raise ValueError(f"config file {str(path)!r} is not valid YAML/JSON: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"config file {str(path)!r} must hold a mapping of keys, got {type(data).__name__}")
    return data


def migrate(data: Mapping[str, Any]) -> dict[str, Any]:
    """Bring old Accelerate layouts to the current one (legacy `fp16`, top-level `dynamo_backend`,
    an unquoted `NO` that YAML read as false)."""
    out = dict(data)
    if "fp16" in out:
        fp16 = out.pop("fp16")
        out.setdefault("mixed_precision", "fp16" if fp16 else "no")
    if "dynamo_backend" in out:
        backend = out.pop("dynamo_backend")
        dynamo = dict(out.get("dynamo_config") or {})
        dynamo.setdefault("dynamo_backend", str(backend).lower())
        out["dynamo_config"] = dynamo
    for key, no in (("distributed_type", "NO"), ("mixed_precision", "no")):
        if out.get(key) is False:  # YAML 1.1 reads an unquoted NO / no as false
            out[key] = no
    out.setdefault("compute_environment", "LOCAL_MACHINE")
    out.setdefault("distributed_type", "NO")
    for section in _SECTIONS:
        if out.get(section) is None and section in out:
            out[section] = {}
    return out


def _yaml_index() -> dict[str, str]:
    from accelerando.launch.flags import OPTIONS

    return {key: opt.name for opt in OPTIONS for key in opt.yaml}


def flatten(data: Mapping[str, Any], path: Path) -> ConfigFile:
    """Turn a (migrated) config mapping into launch option values; warn about unknown keys."""
    if str(data.get("compute_environment", "LOCAL_MACHINE")).upper() == "AMAZON_SAGEMAKER":
        raise ValueError(
            f"config file {str(path)!r} targets AMAZON_SAGEMAKER, which accelerando cannot launch"
        )
    index = _yaml_index()
    values: dict[str, Any] = {}
    keys: dict[str, str] = {}
    unknown: list[str] = []
    dist = str(data.get("distributed_type", "NO")).upper()
    if dist not in _DISTRIBUTED_TYPES:
        raise ValueError(
            f"config file {str(path)!r}: distributed_type {dist!r} is not one of {', '.join(_DISTRIBUTED_TYPES)}"
        )
    switch = _DISTRIBUTED_TYPES[dist]
    if switch:
        values[switch], keys[switch] = True, f"distributed_type: {dist}"
    _validate_fsdp_section(data.get("fsdp_config"), path)
    for key, value in data.items():
        if key in _SECTIONS and isinstance(value, Mapping):
            entries = [(f"{key}.{sub}", sub_value) for sub, sub_value in value.items()]
        else:
            entries = [(key, value)]
        for dotted, item in entries:
            if dotted in index:
                if item is not None and index[dotted] not in values:
                    values[index[dotted]], keys[index[dotted]] = item, dotted
            elif dotted.split(".")[0] not in _IGNORED and dotted != "distributed_type":
                unknown.append(dotted)
    if unknown:
        warnings.warn(
            f"config file {str(path)}: unknown keys ignored: {', '.join(sorted(unknown))}", stacklevel=2
        )
    if values.get("num_processes") == -1:  # Accelerate's "must be given on the command line"
        del values["num_processes"], keys["num_processes"]
    return ConfigFile(path=path, values=values, keys=keys, raw=dict(data))


def _validate_fsdp_section(section: Any, path: Path) -> None:
    """Renamed keys and bad values fail where the file is read; unknown keys only warn (in `flatten`)."""
    if not isinstance(section, Mapping):
        return
    from accelerando.config.fsdp import RENAMED_YAML_KEYS, YAML_KEYS, fsdp_config_to_env

    checked = {k: v for k, v in section.items() if k in YAML_KEYS or k in RENAMED_YAML_KEYS}
    try:
        fsdp_config_to_env(checked)
    except ValueError as err:
        raise ValueError(f"config file {str(path)!r}: {err}") from None


def load_config(path: str | os.PathLike[str]) -> ConfigFile:
    """Load an accelerando or Accelerate config file for `launch`."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ValueError(f"config file {str(p)!r} does not exist; create one with `accelerando config`")
    return flatten(migrate(read_mapping(p)), p)


def save_config(data: Mapping[str, Any], path: str | os.PathLike[str], *, as_json: bool = False) -> Path:
    """Write YAML (or JSON, which Accelerate also reads) atomically: temporary name, then rename."""
    p = Path(path).expanduser()
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            if as_json:
                fh.write(json.dumps(dict(data), indent=2, sort_keys=True) + "\n")
            else:
                yaml.safe_dump(dict(data), fh, sort_keys=True, default_flow_style=False)
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return p


def basic_config(mixed_precision: str, device_type: str, device_count: int) -> dict[str, Any]:
    """The config `accelerando config default` writes for this machine."""
    if mixed_precision not in ("no", "fp16", "bf16", "fp8"):
        raise ValueError(f"mixed_precision {mixed_precision!r} is not one of no, fp16, bf16, fp8")
    cpu = device_type == "cpu"
    multi = not cpu and device_count > 1
    return {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
        "distributed_type": f"MULTI_{device_type.upper()}" if multi else "NO",
        "downcast_bf16": "no",
        "enable_cpu_affinity": False,
        "machine_rank": 0,
        "main_training_function": "main",
        "mixed_precision": mixed_precision,
        "num_machines": 1,
        "num_processes": device_count if multi else 1,
        "same_network": False,
        "use_cpu": cpu,
    }


def write_basic_config(
    mixed_precision: str = "no", save_location: str | os.PathLike[str] | None = None
) -> Path | Literal[False]:
    """Write a minimal config for what this machine has (its accelerators, else CPU) and return its
    path; an existing file is left alone (False). `save_location` None: the per-user file."""
    from accelerando.devices.registry import accelerator_device

    path = Path(save_location).expanduser() if save_location else default_config_path()
    if path.exists():
        print(
            f"Configuration already exists at {path}, will not override: remove it, run `accelerando config "
            "update`, or pass another `save_location`."
        )
        return False
    device = accelerator_device()
    count = device.device_count() if device.type != "cpu" else 0
    return save_config(basic_config(str(mixed_precision).lower(), device.type, count), path)
