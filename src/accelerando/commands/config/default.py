"""`accelerando config default` and Accelerate's `write_basic_config`: a config for this machine, no questions."""

from __future__ import annotations

import argparse

from accelerando.config.yaml_config import write_basic_config


def run_default(args: argparse.Namespace) -> int:
    path = write_basic_config(args.mixed_precision, args.config_file)
    if path:
        print(f"accelerando config default: written to {path}")
    return 0
