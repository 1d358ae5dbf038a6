"""`accelerando launch [flags] script.py [script args]`: Accelerate's launch flags, torchrun's agent."""

from __future__ import annotations

import argparse
import sys
import warnings
from typing import Any

from accelerando.commands._args import add_flag
from accelerando.launch.flags import OPTIONS

_KIND_TYPES: dict[str, Any] = {"int": int, "float": float, "str": str, "bool": str}


def add_launch_arguments(parser: argparse.ArgumentParser) -> None:
    """Every option of the table, grouped as in `accelerate launch --help`; absent flags stay absent."""
    general = parser.add_argument_group("General")
    add_flag(general, "config_file", default=None, help="config file (default: `accelerando config`'s file)")
    add_flag(general, "quiet", "-q", action="store_true", help="do not print the resolved configuration")
    add_flag(general, "module", "-m", action="store_true", help="run the target as a module, like python -m")
    add_flag(
        general, "no_python", action="store_true", help="run the target as an executable, not with python"
    )
    groups: dict[str, argparse._ArgumentGroup] = {"General": general}
    for opt in OPTIONS:
        group = groups.get(opt.group) or groups.setdefault(opt.group, parser.add_argument_group(opt.group))
        help_text = opt.help + (f" (default: {opt.default})" if opt.default not in (None, "") else "")
        if opt.refused:
            help_text += f" [refused: {opt.refused.split(';')[0]}]"
        if opt.kind == "switch":
            add_flag(
                group, opt.name, opt.short, action="store_true", default=argparse.SUPPRESS, help=help_text
            )
        else:
            metavar = "{" + ",".join(opt.choices) + "}" if opt.choices else opt.kind.upper()
            add_flag(group, opt.name, opt.short, type=_KIND_TYPES[opt.kind], default=argparse.SUPPRESS,
                     metavar=metavar, help=help_text)  # fmt: skip
    parser.add_argument(
        "training_script", help="script path (or module with -m, executable with --no_python)"
    )
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER, help="arguments for the script")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = sub.add_parser(
        "launch",
        help="start a training script on every process of this machine",
        description="Launch a script with torchrun's elastic agent. Settings come from, in order: flags, "
        "environment (ACCELERANDO_*/ACCELERATE_*, FSDP_*, ...), the config file, defaults.",
    )
    add_launch_arguments(parser)
    parser.set_defaults(func=run)


def cli_values(args: argparse.Namespace) -> dict[str, Any]:
    """The launch options the user actually typed (argparse.SUPPRESS leaves the others out)."""
    names = {o.name for o in OPTIONS}
    return {k: v for k, v in vars(args).items() if k in names}


def compile_backends() -> list[str]:
    """Every compile backend torch has registered (imports torch._dynamo: seconds)."""
    import torch._dynamo

    return list(torch._dynamo.list_backends(exclude_tags=()))


def _load_config(path: str | None) -> Any:
    from accelerando.config.yaml_config import find_default_config, load_config

    chosen = path or find_default_config()
    return load_config(chosen) if chosen else None


def run(args: argparse.Namespace) -> int:
    """Resolve the configuration once, print it with sources, start the agent."""
    from accelerando.config import env as envmod
    from accelerando.launch import torchrun
    from accelerando.launch.ports import free_port, port_is_free
    from accelerando.launch.settings import detect_machine, resolve

    target = torchrun.Target(
        script=args.training_script,
        args=tuple(args.training_script_args),
        module=args.module,
        no_python=args.no_python,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = _load_config(args.config_file)
        detected = detect_machine()
        resolved = resolve(
            cli_values(args), envmod.snapshot(), config, detected,
            port_is_free=port_is_free, free_port=free_port, compile_backends=compile_backends,
        )  # fmt: skip
    if resolved["enable_cpu_affinity"] and target.no_python:
        raise ValueError(
            "--enable_cpu_affinity pins Python processes in accelerando's worker bootstrap; an executable "
            "started with --no_python does not go through it (pin it yourself, e.g. with taskset)"
        )
    if resolved["as_accelerate"] and target.no_python:
        raise ValueError(
            "--as_accelerate turns the switch on in accelerando's worker bootstrap before a Python script "
            "runs; an executable started with --no_python does not go through it (give the script, or "
            "call accelerando.as_accelerate() in your program)"
        )
    for w in caught:
        print(f"accelerando launch: warning: {w.message}", file=sys.stderr)
    if not args.quiet:
        from accelerando.launch.settings import report

        print(report(resolved), file=sys.stderr, flush=True)
    if not resolved["as_accelerate"]:
        return torchrun.run(resolved, target, detected.device_type)
    from accelerando.launch.accelerate_command import NOTICE, accelerate_command_on_path

    print(NOTICE, file=sys.stderr, flush=True)
    with accelerate_command_on_path() as path, envmod.patch_environment(**path):
        return torchrun.run(resolved, target, detected.device_type)
