"""`accelerando config` (Accelerate's `commands.config` package): the questionnaire, `default`, `update`.

`config_args` gives config files Accelerate's dataclass shape; every file is read and written by
`accelerando.config.yaml_config`, the code `accelerando launch` uses.
"""

from __future__ import annotations

import argparse

from accelerando.commands._args import add_flag
from accelerando.commands.config.config_args import default_config_file, load_config_from_file
from accelerando.commands.config.default import run_default, write_basic_config
from accelerando.commands.config.questionnaire import ask, check_launchable, questionnaire, run_questionnaire
from accelerando.commands.config.update import run_update, update_config


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    """Add `config` and its sub-commands to a `subparsers` object; returns the `config` parser."""
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
    return parser


def get_config_parser(subparsers: argparse._SubParsersAction | None = None) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    """Accelerate's entry: the `config` parser, added to `subparsers` or standalone."""
    if subparsers is None:
        subparsers = argparse.ArgumentParser("accelerando").add_subparsers()
    return register(subparsers)


__all__ = [
    "ask",
    "check_launchable",
    "default_config_file",
    "get_config_parser",
    "load_config_from_file",
    "questionnaire",
    "register",
    "run_default",
    "run_questionnaire",
    "run_update",
    "update_config",
    "write_basic_config",
]
