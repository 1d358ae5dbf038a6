"""`accelerando config`: write the per-user launch config (questionnaire, `default`, `update`).

The file is Accelerate's format, so it also works with `accelerate launch`, and lives at
`$ACCELERANDO_CONFIG_FILE`, else `$HF_HOME/accelerando/default_config.yaml`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from accelerando.commands._args import add_flag

_KINDS = {
    "1": ("NO", "one process (no distributed training)"),
    "2": ("MULTI_CPU", "several CPU processes (gloo)"),
    "3": ("MULTI_GPU", "several GPUs / accelerators (DDP)"),
    "4": ("FSDP", "FSDP"),
    "5": ("DEEPSPEED", "DeepSpeed"),
}


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = sub.add_parser("config", help="create or update the launch config file")
    add_flag(parser, "config_file", default=None, help="file to write (default: the per-user file)")
    parser.set_defaults(func=run_questionnaire)
    actions = parser.add_subparsers(dest="config_command")
    default = actions.add_parser("default", help="write a basic config for this machine, no questions")
    add_flag(default, "config_file", default=argparse.SUPPRESS, help="file to write")
    add_flag(default, "mixed_precision", default="no", choices=("no", "fp16", "bf16", "fp8"))
    default.set_defaults(func=run_default)
    update = actions.add_parser("update", help="migrate an older config file to the current layout")
    add_flag(update, "config_file", default=argparse.SUPPRESS, help="file to update")
    update.set_defaults(func=run_update)


def _target(path: str | None) -> Path:
    from accelerando.config.yaml_config import default_config_path

    return Path(path).expanduser() if path else default_config_path()


def ask(
    prompt: str, default: Any, convert: Callable[[str], Any] = str, read: Callable[[str], str] = input
) -> Any:
    """One question; empty answer (or end of input) keeps the default; bad answers are asked again."""
    for _ in range(5):
        try:
            answer = read(f"{prompt} [{default}]: ").strip()
        except EOFError:
            return default
        if not answer:
            return default
        try:
            return convert(answer)
        except ValueError as err:
            print(f"  {err}", file=sys.stderr)
    raise ValueError(f"no valid answer for {prompt!r}")


def _choice(options: tuple[str, ...]) -> Callable[[str], str]:
    def convert(text: str) -> str:
        if text not in options:
            raise ValueError(f"{text!r} is not one of {', '.join(options)}")
        return text

    return convert


def _yes(text: str) -> bool:
    from accelerando.config.env import parse_bool

    return parse_bool(text, "answer")


def questionnaire(read: Callable[[str], str] = input) -> dict[str, Any]:
    """The questions `accelerando config` asks, as a config mapping."""
    print("Which kind of training?\n" + "\n".join(f"  {k}) {label}" for k, (_, label) in _KINDS.items()))
    kind = _KINDS[ask("choice", "1", _choice(tuple(_KINDS)), read)][0]
    cfg: dict[str, Any] = {"compute_environment": "LOCAL_MACHINE", "distributed_type": kind, "debug": False}
    cfg["use_cpu"] = kind == "MULTI_CPU" or (kind == "NO" and ask("run on CPU only?", "no", _yes, read))
    cfg["num_machines"] = ask("how many machines?", 1, int, read) if kind != "NO" else 1
    if cfg["num_machines"] > 1:
        cfg["machine_rank"] = ask("rank of this machine", 0, int, read)
        cfg["main_process_ip"] = ask("IP address of machine 0", "127.0.0.1", str, read)
        cfg["main_process_port"] = ask("port on machine 0", 29500, int, read)
        cfg["rdzv_backend"] = ask("rendezvous (c10d or static)", "c10d", _choice(("c10d", "static")), read)
    cfg["num_processes"] = ask("total processes over all machines", 2 if kind != "NO" else 1, int, read)
    if kind == "FSDP":
        cfg["fsdp_config"] = {
            "fsdp_version": ask("FSDP version (1 or 2)", 2, int, read),
            "fsdp_auto_wrap_policy": ask("auto wrap policy", "TRANSFORMER_BASED_WRAP", str, read),
            "fsdp_state_dict_type": ask("state dict type", "SHARDED_STATE_DICT", str, read),
        }
    if kind == "DEEPSPEED":
        cfg["deepspeed_config"] = {
            "zero_stage": ask("ZeRO stage (0-3)", 2, int, read),
            "gradient_accumulation_steps": ask("gradient accumulation steps", 1, int, read),
        }
    cfg["mixed_precision"] = ask("mixed precision (no, fp16, bf16, fp8)", "no", _choice(("no", "fp16", "bf16", "fp8")),
                                 read)  # fmt: skip
    backend = ask("torch.compile backend (no, inductor, eager, aot_eager, ...)", "no", str, read)
    if backend != "no":
        cfg["dynamo_config"] = {"dynamo_backend": backend}
    return cfg


def run_questionnaire(args: argparse.Namespace) -> int:
    from accelerando.config.yaml_config import save_config

    path = save_config(questionnaire(), _target(args.config_file))
    print(f"accelerando config: written to {path}")
    return 0


def run_default(args: argparse.Namespace) -> int:
    """Write a minimal config for what this machine has; leave an existing file alone."""
    from accelerando.config.yaml_config import basic_config, save_config
    from accelerando.devices.registry import accelerator_device

    path = _target(args.config_file)
    if path.exists():
        print(
            f"accelerando config default: {path} already exists; remove it or use `accelerando config update`"
        )
        return 0
    device = accelerator_device()
    count = device.device_count() if device.type != "cpu" else 0
    save_config(basic_config(args.mixed_precision, device.type, count), path)
    print(f"accelerando config default: written to {path}")
    return 0


def run_update(args: argparse.Namespace) -> int:
    """Load (migrating legacy keys), report unknown keys, write back in the current layout."""
    from accelerando.config.yaml_config import load_config, migrate, read_mapping, save_config

    path = _target(args.config_file)
    load_config(path)  # validates and warns about unknown keys
    save_config(migrate(read_mapping(path)), path)
    print(f"accelerando config update: {path} updated")
    return 0
