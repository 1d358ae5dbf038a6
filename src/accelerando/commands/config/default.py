"""`accelerando config default` and Accelerate's `write_basic_config`: a config for this machine, no questions."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Literal


def write_basic_config(
    mixed_precision: str = "no", save_location: str | os.PathLike[str] | None = None
) -> Path | Literal[False]:
    """Write a minimal config for what this machine has (its accelerators, else CPU) and return its
    path; an existing file is left alone (False). `save_location` None: the per-user file."""
    from accelerando.config.yaml_config import basic_config, default_config_path, save_config
    from accelerando.devices.registry import accelerator_device

    path = Path(save_location).expanduser() if save_location else default_config_path()
    if path.exists():
        print(
            f"Configuration already exists at {path}, will not override: remove it, run `accelerando config "
            "update`, or pass another `save_location`."
        )
        return False
    device = accelerator_device()
    count = device.device_count() if device.type != "cpu" else 0
    return save_config(basic_config(str(mixed_precision).lower(), device.type, count), path)


def run_default(args: argparse.Namespace) -> int:
    path = write_basic_config(args.mixed_precision, args.config_file)
    if path:
        print(f"accelerando config default: written to {path}")
    return 0
