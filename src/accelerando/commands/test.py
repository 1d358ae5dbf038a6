"""`accelerando test`: launch the built-in end-to-end check with the configured processes."""

from __future__ import annotations

import argparse
from pathlib import Path

from accelerando.commands._args import add_flag

SUCCESS = "Test is a success! You are ready for your distributed training!"


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = sub.add_parser("test", help="run a short end-to-end check on the configured processes")
    add_flag(parser, "config_file", default=None, help="config file to test (default: the per-user file)")
    parser.set_defaults(func=run)


def launch_argv(config_file: str | None) -> list[str]:
    """The `accelerando launch` arguments the check runs with."""
    from accelerando.launch import selftest

    argv = ["launch"]
    if config_file:
        argv += ["--config_file", config_file]
    return [*argv, str(Path(selftest.__file__))]


def run(args: argparse.Namespace) -> int:
    """Launch in this process (same resolution and printout as a real launch); say pass or fail."""
    from accelerando.commands.main import main

    status = main(launch_argv(args.config_file))
    print(
        SUCCESS if status == 0 else f"accelerando test: FAILED (exit status {status}); see the output above"
    )
    return status
