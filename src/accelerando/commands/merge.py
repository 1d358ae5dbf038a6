"""Accelerate's `accelerate.commands.merge` names, over `accelerando merge-weights`."""

from __future__ import annotations

import argparse
from typing import Any

from accelerando.commands.merge_weights import add_arguments, run

__all__ = ["merge_command", "merge_command_parser"]


def merge_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The `merge-weights` parser: a sub-command of `subparsers`, or a parser of its own."""
    if subparsers is not None:
        parser: argparse.ArgumentParser = subparsers.add_parser("merge-weights")
    else:
        parser = argparse.ArgumentParser("accelerando merge-weights")
    add_arguments(parser)
    return parser


def merge_command(args: argparse.Namespace) -> int:
    return run(args)
