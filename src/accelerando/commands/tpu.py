"""`accelerando tpu-config`: run setup commands on every worker of a Cloud TPU pod through `gcloud`.

The pod's name and zone and the commands come from the flags, else from the config file
(`tpu_name`, `tpu_zone`, `commands`, `command_file`, as Accelerate writes them). `--debug` prints
the `gcloud` command instead of running it.
"""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

from packaging.version import InvalidVersion, Version

from accelerando.commands._args import add_flag
from accelerando.config.yaml_config import find_default_config, read_mapping

_DESCRIPTION = "Run commands on every worker of a Cloud TPU pod (gcloud compute tpus tpu-vm ssh)"


def tpu_command_parser(subparsers: argparse._SubParsersAction | None = None) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    if subparsers is not None:
        parser = subparsers.add_parser("tpu-config", description=_DESCRIPTION, help=_DESCRIPTION)
    else:
        parser = argparse.ArgumentParser(prog="accelerando tpu-config", description=_DESCRIPTION)
    add_flag(parser, "config_file", default=None, help="config file with tpu_name, tpu_zone and commands")
    add_flag(parser, "tpu_name", default=None, help="the pod (default: the config file's tpu_name)")
    add_flag(parser, "tpu_zone", default=None, help="its zone (default: the config file's tpu_zone)")
    add_flag(parser, "use_alpha", action="store_true", help="use `gcloud alpha`")
    add_flag(parser, "command_file", default=None, help="a file of commands, one per line")
    add_flag(parser, "command", action="append", nargs="+", help="a command to run (repeatable)")
    add_flag(
        parser, "install_accelerate", action="store_true", help="pip install the package on the pod first"
    )
    add_flag(parser, "accelerate_version", default="latest", help="'latest', 'dev' or a version number")
    add_flag(parser, "debug", action="store_true", help="print the gcloud command instead of running it")
    parser.set_defaults(func=tpu_command_launcher)
    return parser


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    tpu_command_parser(sub)


def _package(version: str) -> str:
    if version == "latest":
        return "accelerando -U"
    if version == "dev":
        raise ValueError(
            "--accelerate_version dev: accelerando has no public development repository URL to install from"
        )
    try:
        return f"accelerando=={Version(version)}"
    except InvalidVersion:
        raise ValueError(f"--accelerate_version {version!r} is not 'latest' or a version number") from None


def gcloud_command(args: argparse.Namespace) -> list[str]:
    """The `gcloud` argument list for `args`, with config-file defaults applied."""
    path = Path(args.config_file) if args.config_file else find_default_config()
    defaults = read_mapping(path) if path is not None else {}
    commands = [line for group in args.command or [] for line in group]
    command_file = args.command_file or (None if commands else defaults.get("command_file"))
    if command_file:
        commands = Path(command_file).read_text().splitlines()
    elif not commands:
        commands = list(defaults.get("commands") or [])
    if not commands:
        raise ValueError("give --command or --command_file (or commands/command_file in the config file)")
    name, zone = args.tpu_name or defaults.get("tpu_name"), args.tpu_zone or defaults.get("tpu_zone")
    if not name or not zone:
        raise ValueError("the pod needs --tpu_name and --tpu_zone (or tpu_name/tpu_zone in the config file)")
    setup = [
        "cd /usr/share",
        *([f"pip install {_package(args.accelerate_version)}"] if args.install_accelerate else []),
    ]
    return [
        "gcloud", *(["alpha"] if args.use_alpha else []), "compute", "tpus", "tpu-vm", "ssh", str(name),
        "--zone", str(zone), "--command", "; ".join([*setup, *commands]), "--worker", "all",
    ]  # fmt: skip


def tpu_command_launcher(args: argparse.Namespace) -> int:
    cmd = gcloud_command(args)
    if args.debug:
        print(f"Running {' '.join(cmd)}")  # Accelerate's exact output
        return 0
    return subprocess.run(cmd, check=False).returncode
