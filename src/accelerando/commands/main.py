"""`accelerando` command line: a registry of sub-commands, one module each.

A new command is a module under `accelerando.commands` with `register(subparsers)` that sets
`func` on its parser, plus one line in `COMMANDS`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# name -> module (imported only when its command runs, so `--help` stays fast).
COMMANDS: dict[str, str] = {
    "config": "accelerando.commands.config",
    "env": "accelerando.commands.env",
    "launch": "accelerando.commands.launch",
    "test": "accelerando.commands.test",
    "estimate-memory": "accelerando.commands.estimate",
    "merge-weights": "accelerando.commands.merge_weights",
    "to-fsdp2": "accelerando.commands.to_fsdp2",
    "tpu-config": "accelerando.commands.tpu",
}


def build_parser(only: str | None = None, prog: str = "accelerando") -> argparse.ArgumentParser:
    """The top-level parser; `only` registers a single command (its module alone is imported)."""
    parser = argparse.ArgumentParser(prog, description="Run one PyTorch script anywhere.")
    sub = parser.add_subparsers(dest="command", metavar="{" + ",".join(COMMANDS) + "}")
    for name, module in COMMANDS.items():
        if only is None or name == only:
            importlib.import_module(module).register(sub)
        else:
            sub.add_parser(name, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "accelerando") -> int:
    """Entry point of the `accelerando` console script; returns (and exits with) the status."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    first = next((a for a in args_list if not a.startswith("-")), None)
    parser = build_parser(first if first in COMMANDS else None, prog)
    args = parser.parse_args(args_list)
    if not getattr(args, "func", None):
        parser.print_help()
        return 1
    try:
        status = int(args.func(args) or 0)
    except (ValueError, OSError) as err:  # bad input or a missing file: a message, not a traceback
        print(f"{prog} {args.command}: error: {err}", file=sys.stderr)
        status = 2
    return status


if __name__ == "__main__":
    sys.exit(main())
