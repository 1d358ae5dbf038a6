"""`accelerando launch [flags] script.py [script args]`: Accelerate's launch flags, torchrun's agent."""

from __future__ import annotations

import argparse
import sys
import warnings
from typing import Any

from accelerando.commands._args import add_flag
from accelerando.launch.flags import OPTIONS

_KIND_TYPES: dict[str, Any] = {"int": int, "float": float, "str": str, "bool": str}


def add_launch_arguments(parser: argparse.ArgumentParser, accelerate_shape: bool = False) -> None:
    """Every option of the table, grouped as in `accelerate launch --help`.

    By default a flag nobody typed stays out of the Namespace; `accelerate_shape` gives every field
    the default and type Accelerate's parser gives it instead, and adds the flags only it has.
    """
    from accelerando.commands import _launch_shape as shape

    general = parser.add_argument_group("General")
    store, switch = (shape.STORE, shape.STORE_TRUE) if accelerate_shape else ("store", "store_true")
    off = None if accelerate_shape else False  # Accelerate leaves these three None when not typed
    add_flag(
        general,
        "config_file",
        action=store,
        default=None,
        help="config file (default: `accelerando config`'s file)",
    )
    add_flag(
        general, "quiet", "-q", action=switch, default=off, help="do not print the resolved configuration"
    )
    add_flag(
        general, "module", "-m", action=switch, default=off, help="run the target as a module, like python -m"
    )
    add_flag(
        general,
        "no_python",
        action=switch,
        default=off,
        help="run the target as an executable, not with python",
    )
    groups: dict[str, argparse._ArgumentGroup] = {"General": general}
    for opt in OPTIONS:
        group = groups.get(opt.group) or groups.setdefault(opt.group, parser.add_argument_group(opt.group))
        help_text = opt.help + (f" (default: {opt.default})" if opt.default not in (None, "") else "")
        if opt.refused:
            help_text += f" [refused: {opt.refused.split(';')[0]}]"
        if opt.kind == "switch":
            kwargs: dict[str, Any] = (
                {"action": shape.STORE_TRUE, "default": shape.DEFAULTS.get(opt.name, False)}
                if accelerate_shape
                else {"action": "store_true", "default": argparse.SUPPRESS}
            )
        else:
            metavar = "{" + ",".join(opt.choices) + "}" if opt.choices else opt.kind.upper()
            kwargs = {"type": _KIND_TYPES[opt.kind], "default": argparse.SUPPRESS, "metavar": metavar}
            if accelerate_shape:
                kwargs.update(action=shape.STORE, default=shape.DEFAULTS.get(opt.name))
                kwargs["type"] = shape.TYPES.get(opt.name, kwargs["type"])
                if opt.name in shape.CHOICES:
                    kwargs["choices"] = shape.CHOICES[opt.name]
        add_flag(group, opt.name, opt.short, help=help_text, **kwargs)
    if accelerate_shape:
        shape.add_accelerate_only(parser)
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


def _target(args: argparse.Namespace) -> Any:
    from accelerando.launch import torchrun

    if args.module and args.no_python:
        raise ValueError("--module and --no_python cannot be used together")
    return torchrun.Target(
        script=args.training_script,
        args=tuple(args.training_script_args),
        module=bool(args.module),
        no_python=bool(args.no_python),
    )


def _resolve(cli: dict[str, Any], config_file: str | None) -> tuple[Any, Any, Any]:
    """(resolved settings, the loaded config file or None, what was detected), warnings printed."""
    from accelerando.config import env as envmod
    from accelerando.launch.ports import free_port, port_is_free
    from accelerando.launch.settings import detect_machine, resolve

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = _load_config(config_file)
        detected = detect_machine()
        resolved = resolve(
            cli, envmod.snapshot(), config, detected,
            port_is_free=port_is_free, free_port=free_port, compile_backends=compile_backends,
        )  # fmt: skip
    for w in caught:
        print(f"accelerando launch: warning: {w.message}", file=sys.stderr)
    return resolved, config, detected


def _start(resolved: Any, target: Any, device_type: str, quiet: bool) -> int:
    """Print the configuration (unless quiet), start the agent, wait; the exit status."""
    from accelerando.config import env as envmod
    from accelerando.launch import torchrun

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
    if not quiet:
        from accelerando.launch.settings import report

        print(report(resolved), file=sys.stderr, flush=True)
    if not resolved["as_accelerate"]:
        return torchrun.run(resolved, target, device_type)
    from accelerando.launch.accelerate_command import NOTICE, accelerate_command_on_path

    print(NOTICE, file=sys.stderr, flush=True)
    with accelerate_command_on_path() as path, envmod.patch_environment(**path):
        return torchrun.run(resolved, target, device_type)


def run(args: argparse.Namespace) -> int:
    """`accelerando launch`: resolve the configuration once, print it with sources, start the agent."""
    target = _target(args)
    resolved, _, detected = _resolve(cli_values(args), args.config_file)
    return _start(resolved, target, detected.device_type, args.quiet)


# ---- Accelerate's names: `launch_command_parser`, `_validate_launch_command`, `launch_command` ----


def launch_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """A parser for Accelerate's launch command line whose Namespace has Accelerate's fields, defaults
    and types (see `commands._launch_shape`); `launch_command` runs what it parses."""
    description = (
        "Launch a script on every process of this machine (accelerando's launcher, Accelerate's flags; "
        "`--num-processes` and `--num_processes` both work)."
    )
    if subparsers is not None:
        parser = subparsers.add_parser("launch", description=description, allow_abbrev=False)
    else:
        parser = argparse.ArgumentParser("accelerando launch", description=description, allow_abbrev=False)
    add_launch_arguments(parser, accelerate_shape=True)
    parser.set_defaults(func=launch_command)
    return parser


def _accelerate_cli_values(args: argparse.Namespace) -> dict[str, Any]:
    """The launch options typed in an Accelerate-shaped Namespace, refusing what cannot be honoured."""
    from accelerando.commands import _launch_shape as shape
    from accelerando.launch.flags import BY_NAME

    defaults = {**{o.name: shape.DEFAULTS.get(o.name) for o in OPTIONS}, **{
        name: spec[1] for name, spec in shape.ONLY_ACCELERATE.items()}}  # fmt: skip
    typed = shape.typed_fields(args, defaults)
    if "mpirun_hostfile" in typed:
        raise ValueError(
            f"--mpirun_hostfile {args.mpirun_hostfile!r}: accelerando does not launch through mpirun; use "
            "--num_machines N --machine_rank R on each machine"
        )
    offload = str(getattr(args, "fsdp_activation_checkpointing_offload", "false")).lower()
    if "fsdp_activation_checkpointing_offload" in typed and offload not in ("false", "0", "no"):
        raise ValueError(
            f"--fsdp_activation_checkpointing_offload {offload}: offloading checkpointed activations is not "
            "available in accelerando; use --fsdp_activation_checkpointing true without it"
        )
    values = {}
    for name in typed & set(BY_NAME):
        value = getattr(args, name)
        if isinstance(value, tuple):  # Accelerate's (fprop, dgrad, wgrad) booleans
            value = ",".join(str(v).lower() for v in value)
        if value is not None and not (BY_NAME[name].kind == "switch" and value is False):
            values[name] = value
    if getattr(args, "use_cpu", False):  # Accelerate's config spelling of --cpu
        values["cpu"] = True
    return values


def _validate(args: argparse.Namespace) -> tuple[argparse.Namespace, Any, bool, Any, Any]:
    """`_validate_launch_command`, also returning the resolved settings and what was detected."""
    from accelerando.commands.config.config_args import ClusterConfig
    from accelerando.launch.settings import DEFAULT

    resolved, config, detected = _resolve(_accelerate_cli_values(args), args.config_file)
    for name, value in resolved.values.items():
        if value is not None:  # what the launch will use; a setting nobody gave keeps its field
            setattr(args, name, value)
    args.use_cpu, args.debug = resolved["cpu"], bool(resolved["debug"])
    if config is not None and args.gpu_ids is None:  # Accelerate's default once a config file is read
        args.gpu_ids = "all"
    defaults = ClusterConfig.from_mapping(config.raw, config.path) if config is not None else None
    where = resolved.sources["mixed_precision"]
    mp_from_config_flag = where != DEFAULT and where.startswith("config ")
    return args, defaults, mp_from_config_flag, resolved, detected


def _validate_launch_command(args: argparse.Namespace) -> tuple[argparse.Namespace, Any, bool]:
    """Accelerate's check-and-complete step: `args` gets every setting the launch will use (flag >
    environment > config file > default, accelerando's precedence) and a ValueError names a bad one.
    Returns `(args, defaults, mp_from_config_flag)`: the config file as a `ClusterConfig` (or None)
    and whether mixed precision came from it."""
    args, defaults, mp_from_config_flag, _, _ = _validate(args)
    return args, defaults, mp_from_config_flag


def launch_command(args: argparse.Namespace) -> None:
    """Run the script described by a `launch_command_parser` Namespace with accelerando's launcher;
    a failed run exits with its status, as Accelerate's does."""
    target = _target(args)
    args, _, _, resolved, detected = _validate(args)
    status = _start(resolved, target, detected.device_type, args.quiet)
    if status:
        sys.exit(status)
