"""Shared argparse helpers: every flag answers to `--snake_case` and `--kebab-case`."""

from __future__ import annotations

import argparse
from typing import Any


def spellings(name: str, short: str | None = None) -> list[str]:
    """`--num_processes` and `--num-processes` (plus a short form), as Accelerate accepts both."""
    out = [f"--{name}"]
    if "_" in name:
        out.append(f"--{name.replace('_', '-')}")
    if short:
        out.insert(0, short)
    return out


def add_flag(parser: argparse._ActionsContainer, name: str, short: str | None = None, **kwargs: Any) -> None:
    """Add an option under both spellings; its value lands in `name`."""
    kwargs.setdefault("dest", name)
    parser.add_argument(*spellings(name, short), **kwargs)
