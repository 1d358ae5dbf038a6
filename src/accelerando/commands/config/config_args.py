"""Accelerate's `commands.config.config_args`: config files as dataclasses, over accelerando's reader.

Files are read (`read_mapping`, `migrate`) and written (`save_config`, atomic) by
`accelerando.config.yaml_config`, the code `accelerando launch` uses; these classes only give the
mapping Accelerate's shape (`ClusterConfig`, `SageMakerConfig`) so code written against Accelerate
loads, edits and saves the same files. The paths name accelerando's files: `default_config_file` is
the one `accelerando launch` reads when given no `--config_file` (accelerando's own, else
Accelerate's), `cache_dir` the folder accelerando's lives in. Like Accelerate's, they are computed
once at import.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from enum import Enum
from pathlib import Path
from typing import Any

from accelerando.config import yaml_config
from accelerando.config.options import ComputeEnvironment, DistributedType, SageMakerDistributedType

cache_dir = str(yaml_config.cache_dir() / "accelerando")
default_yaml_config_file = str(yaml_config.default_config_path())
default_json_config_file = default_yaml_config_file  # Accelerate keeps both names for one file
default_config_file = str(yaml_config.find_default_config() or default_yaml_config_file)

# Accelerate's defaults for the SageMaker image (informative only: accelerando does not launch there).
SAGEMAKER_PYTORCH_VERSION = "1.10.2"
SAGEMAKER_TRANSFORMERS_VERSION = "4.17.0"
SAGEMAKER_PYTHON_VERSION = "py38"


def load_config_from_file(config_file: str | os.PathLike[str] | None) -> BaseConfig:
    """The config at `config_file` (None: `default_config_file`), as a `ClusterConfig` or, for an
    `AMAZON_SAGEMAKER` file, a `SageMakerConfig`."""
    if config_file is not None and not os.path.isfile(config_file):
        raise FileNotFoundError(
            f"The passed configuration file `{config_file}` does not exist: give an existing file to "
            "`--config_file`, or create the default one with `accelerando config`."
        )
    path = Path(default_config_file if config_file is None else config_file)
    environment = yaml_config.read_mapping(path).get("compute_environment", ComputeEnvironment.LOCAL_MACHINE)
    cls = SageMakerConfig if environment == ComputeEnvironment.AMAZON_SAGEMAKER else ClusterConfig
    return cls._from_file(path)


def _plain(value: Any) -> Any:
    """Enums as their values, nested mappings likewise; an empty mapping counts as unset (None)."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()} or None
    return value


@dataclass
class BaseConfig:
    """Keys every config file has; `to_dict()` is what is written (unset keys left out)."""

    compute_environment: ComputeEnvironment
    distributed_type: DistributedType | SageMakerDistributedType
    mixed_precision: str
    use_cpu: bool
    debug: bool

    def to_dict(self) -> dict[str, Any]:
        plain = {f.name: _plain(getattr(self, f.name)) for f in fields(self)}
        return {k: v for k, v in plain.items() if v is not None}

    @staticmethod
    def process_config(config_dict: dict[str, Any]) -> dict[str, Any]:
        """The file's mapping with legacy keys migrated and Accelerate's defaults for missing ones."""
        if "distributed_type" not in config_dict:
            raise ValueError("A `distributed_type` must be specified in the config file.")
        data = yaml_config.migrate(config_dict)
        if data["distributed_type"] == DistributedType.NO:
            data.setdefault("num_processes", 1)
        data.setdefault("mixed_precision", None)
        for key in ("use_cpu", "debug", "enable_cpu_affinity"):
            data.setdefault(key, False)
        return data

    @classmethod
    def _from_file(cls, path: Path) -> Any:
        return cls.from_mapping(yaml_config.read_mapping(path), path, strict=True)

    @classmethod
    def from_mapping(cls, data: dict[str, Any], path: str | os.PathLike[str], strict: bool = False) -> Any:
        """The config read from `path` as `data`; keys this class lacks are an error when `strict`
        (Accelerate's loaders), else left out (the launcher, which has already warned about them)."""
        data = cls.process_config(data)
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(data) - set(names))
        if unknown and strict:
            raise ValueError(
                f"The config file at {path} had unknown keys ({unknown}); {cls.__name__} accepts "
                f"{', '.join(names)}. Upgrade accelerando or remove these keys."
            )
        return cls(**{k: v for k, v in data.items() if k in names})

    @classmethod
    def from_json_file(cls, json_file: str | os.PathLike[str] | None = None) -> Any:
        return cls._from_file(Path(default_json_config_file if json_file is None else json_file))

    @classmethod
    def from_yaml_file(cls, yaml_file: str | os.PathLike[str] | None = None) -> Any:
        return cls._from_file(Path(default_yaml_config_file if yaml_file is None else yaml_file))

    def to_json_file(self, json_file: str | os.PathLike[str]) -> None:
        yaml_config.save_config(self.to_dict(), json_file, as_json=True)

    def to_yaml_file(self, yaml_file: str | os.PathLike[str]) -> None:
        yaml_config.save_config(self.to_dict(), yaml_file)

    def __post_init__(self) -> None:
        self.compute_environment = _member(
            ComputeEnvironment, self.compute_environment, "compute_environment"
        )
        kind = (
            SageMakerDistributedType
            if self.compute_environment == ComputeEnvironment.AMAZON_SAGEMAKER
            else DistributedType
        )
        self.distributed_type = _member(kind, self.distributed_type, "distributed_type")
        if getattr(self, "dynamo_config", None) is None:
            self.dynamo_config: dict[str, Any] | None = {}


def _member(kind: type[Enum], value: Any, name: str) -> Any:
    try:
        return kind(value)
    except ValueError:
        accepted = ", ".join(str(m.value) for m in kind)  # type: ignore[attr-defined]
        raise ValueError(f"{name} {value!r} is not one of {accepted}") from None


_SECTIONS = ("fp8_config", "deepspeed_config", "fsdp_config", "parallelism_config", "megatron_lm_config",
             "mpirun_config")  # fmt: skip


@dataclass
class ClusterConfig(BaseConfig):
    """A local-machine (or multi-machine) launch config: Accelerate's keys and defaults."""

    num_processes: int = -1  # -1: to be given on the command line
    machine_rank: int = 0
    num_machines: int = 1
    gpu_ids: str | None = None
    main_process_ip: str | None = None
    main_process_port: int | None = None
    rdzv_backend: str | None = "static"
    same_network: bool | None = False
    main_training_function: str = "main"
    enable_cpu_affinity: bool = False
    fp8_config: dict[str, Any] | None = None
    deepspeed_config: dict[str, Any] | None = None
    fsdp_config: dict[str, Any] | None = None
    parallelism_config: dict[str, Any] | None = None
    megatron_lm_config: dict[str, Any] | None = None
    mpirun_config: dict[str, Any] | None = None
    downcast_bf16: bool = False
    tpu_name: str | None = None
    tpu_zone: str | None = None
    tpu_use_cluster: bool = False
    tpu_use_sudo: bool = False
    command_file: str | None = None
    commands: list[str] | None = None
    tpu_vm: list[str] | None = None
    tpu_env: list[str] | None = None
    dynamo_config: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        for section in _SECTIONS:
            if getattr(self, section) is None:
                setattr(self, section, {})
        super().__post_init__()


@dataclass
class SageMakerConfig(BaseConfig):
    """An Amazon SageMaker config: read and written here, but `accelerando launch` refuses it."""

    ec2_instance_type: str
    iam_role_name: str
    image_uri: str | None = None
    profile: str | None = None
    region: str = "us-east-1"
    num_machines: int = 1
    gpu_ids: str = "all"
    base_job_name: str = "accelerate-sagemaker-1"
    pytorch_version: str = SAGEMAKER_PYTORCH_VERSION
    transformers_version: str = SAGEMAKER_TRANSFORMERS_VERSION
    py_version: str = SAGEMAKER_PYTHON_VERSION
    sagemaker_inputs_file: str | None = None
    sagemaker_metrics_file: str | None = None
    additional_args: dict[str, Any] | None = None
    dynamo_config: dict[str, Any] | None = None
    enable_cpu_affinity: bool = False


__all__ = [
    "BaseConfig",
    "ClusterConfig",
    "SageMakerConfig",
    "cache_dir",
    "default_config_file",
    "default_json_config_file",
    "default_yaml_config_file",
    "load_config_from_file",
]
