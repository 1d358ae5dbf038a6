"""`accelerando config` without a sub-command: the questionnaire that writes the launch config.

The file is Accelerate's format, so it also works with `accelerate launch`, and lives at
`$ACCELERANDO_CONFIG_FILE`, else `$HF_HOME/accelerando/default_config.yaml`.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

_KINDS = {
    "1": ("NO", "one process (no distributed training)"),
    "2": ("MULTI_CPU", "several CPU processes (gloo)"),
    "3": ("MULTI_GPU", "several GPUs / accelerators (DDP)"),
    "4": ("FSDP", "FSDP (parameters sharded with FSDP2)"),
    "5": ("DEEPSPEED", "DeepSpeed (ZeRO stages 0-3)"),
}
_NOT_YET: dict[str, str] = {}  # choices listed with the reason they are refused


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
            print(f"  {answer!r} is not accepted: {err}", file=sys.stderr)
    raise ValueError(f"no valid answer for {prompt!r} after 5 tries")


def _choice(options: tuple[str, ...], refused: Mapping[str, str] | None = None) -> Callable[[str], str]:
    """One of `options`, any case; answers in `refused` get their reason instead."""

    def convert(text: str) -> str:
        for option in options:
            if text.lower() == option.lower():
                return option
        if refused and text in refused:
            raise ValueError(refused[text])
        raise ValueError(f"answer one of {', '.join(options)}")

    return convert


def _yes(text: str) -> bool:
    from accelerando.config.env import parse_bool

    try:
        return parse_bool(text, "answer")
    except ValueError:
        raise ValueError("answer yes or no") from None


def _option(name: str, check: Callable[[Any], None] | None = None) -> Callable[[str], Any]:
    """An answer parsed as `accelerando launch` parses option `name`: same type, choices and range."""
    from accelerando.launch.flags import BY_NAME
    from accelerando.launch.settings import coerce

    def convert(text: str) -> Any:
        value = coerce(BY_NAME[name], text, "answer")
        if check is not None:
            check(value)
        return value

    return convert


def _fsdp_check(name: str) -> Callable[[Any], None]:
    """The FSDP plugin's own check of launch option `name` (e.g. fsdp_version must be 1 or 2)."""
    from accelerando.config.fsdp import check_settings
    from accelerando.launch.flags import BY_NAME

    variable = BY_NAME[name].env or ""
    return lambda value: check_settings(
        {variable: str(value).lower() if isinstance(value, bool) else str(value)}
    )


def _host(text: str) -> str:
    if any(c.isspace() for c in text):
        raise ValueError("give one host name or IP address, without spaces")
    return text


def _class_names(text: str) -> str:
    names = [n.strip() for n in text.split(",")]
    bad = [n for n in names if not n.isidentifier()]
    if bad:
        raise ValueError(f"{', '.join(map(repr, bad))} not a class name; give names like BertLayer,GPT2Block")
    return ",".join(names)


def _machines(cfg: dict[str, Any], read: Callable[[str], str]) -> None:
    cfg["num_machines"] = machines = ask("how many machines?", 1, _option("num_machines"), read)
    if machines > 1:

        def rank_below(value: int) -> None:
            if value >= machines:
                raise ValueError(f"machine ranks are 0 to {machines - 1}")

        cfg["machine_rank"] = ask("rank of this machine", 0, _option("machine_rank", rank_below), read)
        cfg["main_process_ip"] = ask("IP address or host name of machine 0", "127.0.0.1", _host, read)
        cfg["main_process_port"] = ask("port on machine 0", 29500, _option("main_process_port"), read)
        cfg["rdzv_backend"] = ask("rendezvous (c10d or static)", "c10d", _option("rdzv_backend"), read)

    def multiple(value: int) -> None:
        if value % machines:
            raise ValueError(f"the total over {machines} machines must be a multiple of {machines}")

    cfg["num_processes"] = ask(
        "total processes over all machines", 2 * machines, _option("num_processes", multiple), read
    )


def _fsdp_section(read: Callable[[str], str]) -> dict[str, Any]:
    from accelerando.config.fsdp import FULL_STATE_DICT, SHARDED_STATE_DICT

    def fsdp(name: str) -> Callable[[str], Any]:
        return _option(name, _fsdp_check(name))

    section: dict[str, Any] = {"fsdp_version": ask("FSDP version (1 or 2)", 2, fsdp("fsdp_version"), read)}
    policies = ("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP")
    policy = section["fsdp_auto_wrap_policy"] = ask(
        f"auto wrap policy ({', '.join(policies)})", policies[0], _choice(policies), read
    )
    if policy == "TRANSFORMER_BASED_WRAP":
        names = ask("layer classes to wrap, comma separated (empty: the model's own)", "", _class_names, read)
        if names:
            section["fsdp_transformer_layer_cls_to_wrap"] = names
    elif policy == "SIZE_BASED_WRAP":
        section["fsdp_min_num_params"] = ask(
            "minimum parameters per wrapped module", 100_000_000, fsdp("fsdp_min_num_params"), read
        )
    types = (SHARDED_STATE_DICT, FULL_STATE_DICT)
    section["fsdp_state_dict_type"] = ask(
        f"state dict type ({', '.join(types)})", types[0], _choice(types), read
    )
    section["fsdp_offload_params"] = ask("offload parameters to CPU?", "no", _yes, read)
    section["fsdp_activation_checkpointing"] = ask("activation checkpointing?", "no", _yes, read)
    return section


def _deepspeed_file(text: str) -> str:
    """A DeepSpeed JSON config that exists and parses, with its zero_optimization section."""
    from accelerando.config.deepspeed import DeepSpeedPlugin

    DeepSpeedPlugin(hf_ds_config=text, zero3_init_flag=False)
    return text


def _deepspeed_section(read: Callable[[str], str]) -> dict[str, Any]:
    """Accelerate's `deepspeed_config` keys: a JSON file, or the ZeRO stage and its offloads."""
    from accelerando.config.deepspeed import HfDeepSpeedConfig

    section: dict[str, Any] = {}
    if ask("use a DeepSpeed JSON config file?", "no", _yes, read):
        path = section["deepspeed_config_file"] = ask(
            "path of the DeepSpeed JSON file", "", _deepspeed_file, read
        )
        stage = HfDeepSpeedConfig(path).stage
    else:
        stage = section["zero_stage"] = ask("ZeRO stage (0, 1, 2, 3)", 2, _option("zero_stage"), read)
        if stage >= 2:
            device = section["offload_optimizer_device"] = ask(
                "offload optimizer states to (none, cpu, nvme)",
                "none",
                _option("offload_optimizer_device"),
                read,
            )
            if device == "nvme":
                section["offload_optimizer_nvme_path"] = ask(
                    "NVMe path for optimizer states", "/nvme", str, read
                )
        if stage == 3:
            device = section["offload_param_device"] = ask(
                "offload parameters to (none, cpu, nvme)", "none", _option("offload_param_device"), read
            )
            if device == "nvme":
                section["offload_param_nvme_path"] = ask("NVMe path for parameters", "/nvme", str, read)
        section["gradient_accumulation_steps"] = ask(
            "gradient accumulation steps", 1, _option("gradient_accumulation_steps"), read
        )
        if ask("clip gradients at a fixed norm on every step?", "no", _yes, read):
            section["gradient_clipping"] = ask(
                "maximum gradient norm", 1.0, _option("gradient_clipping"), read
            )
    if stage == 3:
        section["zero3_init_flag"] = ask(
            "build transformers models partitioned (zero.Init)?", "yes", _yes, read
        )
        section["zero3_save_16bit_model"] = ask(
            "gather 16-bit weights when saving the model?", "yes", _yes, read
        )
    return section


def _registered_backend(name: str) -> None:
    """Backends beyond torch's built-in ones must be registered here (a package may provide them)."""
    from accelerando.commands.launch import compile_backends
    from accelerando.launch.settings import BUILTIN_COMPILE_BACKENDS

    if name not in BUILTIN_COMPILE_BACKENDS and name not in (available := compile_backends()):
        raise ValueError(
            f"torch has no compile backend {name!r} here; registered: {', '.join(sorted(available))}"
        )


def questionnaire(read: Callable[[str], str] = input) -> dict[str, Any]:
    """The questions `accelerando config` asks, as a config mapping; each answer checked as given.

    Answers go through the same parsers `accelerando launch` applies to the file, and only the
    questions that apply are asked (no process count for one process, no FSDP layout without FSDP).
    """
    menu = [f"  {k}) {label}" for k, (_, label) in _KINDS.items()]
    menu += [f"  ({k}: {why})" for k, why in _NOT_YET.items()]
    print("Which kind of training?\n" + "\n".join(menu))
    kind = _KINDS[ask("choice", "1", _choice(tuple(_KINDS), _NOT_YET), read)][0]
    cfg: dict[str, Any] = {"compute_environment": "LOCAL_MACHINE", "distributed_type": kind, "debug": False}
    if kind == "NO":
        cfg["use_cpu"] = ask("run on CPU only?", "no", _yes, read)
        cfg["num_machines"], cfg["num_processes"] = 1, 1
    else:
        cfg["use_cpu"] = kind == "MULTI_CPU"
        _machines(cfg, read)
    if kind == "FSDP":
        cfg["fsdp_config"] = _fsdp_section(read)
    if kind == "DEEPSPEED":
        cfg["deepspeed_config"] = _deepspeed_section(read)
    cfg["mixed_precision"] = ask(
        "mixed precision (no, fp16, bf16, fp8)", "no", _option("mixed_precision"), read
    )
    prompt = "torch.compile backend (no, inductor, eager, aot_eager, cudagraphs, ...)"
    backend = ask(prompt, "no", _option("dynamo_backend", _registered_backend), read)
    if backend != "no":
        mode = ask("torch.compile mode", "default", _option("dynamo_mode"), read)
        cfg["dynamo_config"] = {"dynamo_backend": backend.upper(), "dynamo_mode": mode}
    return cfg


def check_launchable(cfg: dict[str, Any], path: Path) -> dict[str, Any]:
    """The answers, once more as `accelerando launch` will read them from the file (a ValueError if not)."""
    from accelerando.config.yaml_config import flatten, migrate
    from accelerando.launch.settings import Detected, resolve

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. "no accelerator here": the file may be for another machine
        resolve({}, {}, flatten(migrate(cfg), path), Detected())
    return cfg


def run_questionnaire(args: argparse.Namespace) -> int:
    from accelerando.config.yaml_config import save_config

    target = _target(args.config_file)
    path = save_config(check_launchable(questionnaire(), target), target)
    print(f"accelerando config: written to {path}")
    return 0
