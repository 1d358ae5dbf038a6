"""Accelerate's `utils.launch` helpers, answered by accelerando's launcher.

They take the `argparse.Namespace` of a launch command line (Accelerate's or ours), resolve it the
way `accelerando launch` does (`launch/settings.py`: flag > environment > defaults) and return the
command and environment the training processes get. Options accelerando's launcher does not know
are ignored; those it refuses (TPU, Megatron-LM, mpirun) raise a ValueError naming them.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from accelerando.config import env
from accelerando.launch.flags import BY_NAME, DEEPSPEED, FP8, FSDP, PARALLEL
from accelerando.launch.ports import free_port, port_is_free
from accelerando.launch.settings import Resolved, child_exports, detect_machine, resolve


def _cli_values(args: argparse.Namespace) -> dict[str, Any]:
    """The launch options set in `args`: None and off switches mean "not given", port 0 "a free one".

    A feature's options count only when the feature is on (`use_fsdp`, `use_deepspeed`,
    `use_parallelism_config`, fp8 mixed precision), as Accelerate exports them.
    """
    given = vars(args)
    precision = str(given.get("mixed_precision") or "").lower()
    feature_on = {
        FSDP: bool(given.get("use_fsdp")),
        DEEPSPEED: bool(given.get("use_deepspeed")),
        PARALLEL: bool(given.get("use_parallelism_config")),
        FP8: precision == "fp8",
    }
    values: dict[str, Any] = {}
    for name, value in given.items():
        option = BY_NAME.get(name)
        if option is None or value is None or (option.kind == "switch" and value is False):
            continue
        if not feature_on.get(option.group, True) or (name == "main_process_port" and int(value) == 0):
            continue
        values[name] = value
    if given.get("use_cpu"):  # Accelerate's config spelling of --cpu
        values["cpu"] = True
    return values


def _check_target(args: argparse.Namespace) -> None:
    if getattr(args, "module", False) and getattr(args, "no_python", False):
        raise ValueError("--module and --no_python cannot be used together")


def _resolve(args: argparse.Namespace) -> tuple[Resolved, str]:
    """The launch configuration for `args` on this machine, and the machine's device type."""
    detected = detect_machine()
    resolved = resolve(
        _cli_values(args), env.snapshot(), None, detected, port_is_free=port_is_free, free_port=free_port
    )
    return resolved, detected.device_type


def _process_environment(resolved: Resolved, device_type: str) -> dict[str, str]:
    """This process's environment plus what the launcher exports to the training processes."""
    return {**env.snapshot(), **env.launch_environment(child_exports(resolved, device_type))}


def _script_command(args: argparse.Namespace) -> list[str]:
    command = [] if getattr(args, "no_python", False) else [sys.executable]
    if getattr(args, "module", False):
        command.append("-m")
    return [*command, args.training_script, *getattr(args, "training_script_args", [])]


def prepare_simple_launcher_cmd_env(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """Command and environment to run the script as one plain process (no torchrun agent)."""
    _check_target(args)
    if getattr(args, "mpirun_hostfile", None):
        raise ValueError(
            f"--mpirun_hostfile {args.mpirun_hostfile!r}: accelerando does not launch through mpirun; "
            "use `accelerando launch --num_machines N --machine_rank R` on each machine"
        )
    resolved, device_type = _resolve(args)
    current = _process_environment(resolved, device_type)
    if (getattr(args, "num_processes", None) or 1) > 1 or resolved["num_machines"] > 1:
        current["MASTER_ADDR"] = str(resolved["main_process_ip"])
        current["MASTER_PORT"] = str(resolved["main_process_port"])
    return _script_command(args), current


def prepare_multi_gpu_env(args: argparse.Namespace) -> dict[str, str]:
    """Environment for torchrun's agent and its workers; `args` gains torchrun's own settings
    (`nproc_per_node`, `nnodes`, `node_rank`, `rdzv_backend`, `rdzv_endpoint`, `master_addr`/`master_port`)."""
    _check_target(args)
    resolved, device_type = _resolve(args)
    args.nproc_per_node = str(resolved["nproc_per_node"])
    args.nnodes = str(resolved["num_machines"])
    args.node_rank = int(resolved["machine_rank"])
    args.rdzv_backend = resolved["rdzv_backend"]
    args.main_process_port = resolved["main_process_port"]
    args.master_addr = str(resolved["main_process_ip"])
    args.master_port = str(resolved["main_process_port"])
    args.rdzv_endpoint = f"{resolved['main_process_ip']}:{resolved['main_process_port']}"
    return _process_environment(resolved, device_type)


def prepare_deepspeed_cmd_env(args: argparse.Namespace) -> tuple[list[str] | None, dict[str, str]]:
    """(None, environment) as Accelerate returns on one machine: the processes start as for
    `prepare_multi_gpu_env` (torchrun's agent, `args` gains its settings) with the DeepSpeed
    options exported. DeepSpeed's own multi-node runners (pdsh, openmpi, ...) are not supported."""
    launcher = getattr(args, "deepspeed_multinode_launcher", None) or "pdsh"
    if (getattr(args, "num_machines", None) or 1) > 1 and launcher != "standard":
        raise ValueError(
            f"deepspeed_multinode_launcher={launcher!r}: accelerando starts every machine through torchrun; "
            "use 'standard' and run `accelerando launch --machine_rank R` on each machine"
        )
    args.use_deepspeed = True
    return None, prepare_multi_gpu_env(args)


def prepare_tpu(
    args: argparse.Namespace, current_env: dict[str, str], pod: bool = False
) -> tuple[argparse.Namespace, dict[str, str]]:
    """Accelerate's TPU additions to an environment: bf16 through XLA's variables (on a TPU),
    debug mode, and for a pod the `vm`/`tpu` names gcloud takes. accelerando does not launch on
    TPUs itself (README "Not there yet"); this only prepares the values."""
    from accelerando.utils.imports import is_torch_xla_available

    if getattr(args, "mixed_precision", None) == "bf16" and is_torch_xla_available(check_is_tpu=True):
        current_env["XLA_DOWNCAST_BF16" if getattr(args, "downcast_bf16", False) else "XLA_USE_BF16"] = "1"
    if getattr(args, "debug", False):
        current_env["ACCELERATE_DEBUG_MODE"] = "true"
    if pod:
        args.vm, args.tpu = args.tpu_vm, args.tpu_name
    return args, current_env


def _filter_args(
    args: argparse.Namespace, parser: argparse.ArgumentParser, default_args: list[str] | None = None
) -> argparse.Namespace:
    """`parser`'s defaults (parsed from `default_args`) overridden by the values of `args` it knows:
    the launcher options dropped before they are handed to another tool's parser."""
    kept, _ = parser.parse_known_args(list(default_args or []))
    for key, value in vars(args).items():
        if hasattr(kept, key):
            setattr(kept, key, value)
    return kept


def env_var_path_add(env_var_name: str, path_to_add: str) -> str:
    """The variable's `:`-separated path list with `path_to_add` appended (for a child's environment)."""
    paths = [p for p in (env.raw(env_var_name) or "").split(":") if p]
    return ":".join([*paths, path_to_add])


__all__ = [
    "env_var_path_add",
    "prepare_deepspeed_cmd_env",
    "prepare_multi_gpu_env",
    "prepare_simple_launcher_cmd_env",
    "prepare_tpu",
]
