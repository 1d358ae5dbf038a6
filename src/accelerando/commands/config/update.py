"""`accelerando config update` and Accelerate's `update_config`: rewrite a file in the current layout."""

from __future__ import annotations

import argparse
from pathlib import Path


def update_config(args: argparse.Namespace) -> str:
    """Load `args.config_file` (None: the per-user file), migrating legacy keys and warning about
    unknown ones, and write it back in the current layout; returns its path."""
    from accelerando.config.yaml_config import (
        default_config_path,
        load_config,
        migrate,
        read_mapping,
        save_config,
    )

    path = Path(args.config_file).expanduser() if args.config_file else default_config_path()
    if not path.is_file():
        raise ValueError(f"The passed config file located at {path} doesn't exist.")
    load_config(path)  # validates as `accelerando launch` will, warns about unknown keys
    save_config(migrate(read_mapping(path)), path)
    return str(path)


def run_update(args: argparse.Namespace) -> int:
    print(f"accelerando config update: {update_config(args)} updated")
    return 0
