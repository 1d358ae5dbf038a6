"""`accelerando to-fsdp2`: rewrite a config file's FSDP1 `fsdp_config` block in FSDP2 terms.

FSDP2 (`fully_shard`) has no sharding strategy enum: the choice left is whether parameters are
resharded after forward. Options FSDP2 dropped are removed with a log line saying so; options it
does not have yet likewise; everything else is carried over unchanged. The file is written under
a temporary name and renamed, so an interrupted run never leaves half a config.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from accelerando.commands._args import add_flag
from accelerando.config.yaml_config import read_mapping, save_config

logger = logging.getLogger(__name__)

# Each FSDP1 sharding strategy as FSDP2's reshard-after-forward flag (ZeRO-3-like: True).
RESHARD_AFTER_FORWARD = {
    "FULL_SHARD": True,
    "SHARD_GRAD_OP": False,
    "HYBRID_SHARD": True,
    "HYBRID_SHARD_ZERO2": False,
    "NO_SHARD": False,
}
# FSDP1 keys with no FSDP2 counterpart, and why.
DROPPED = {
    "fsdp_backward_prefetch": "removed in FSDP2 (it prefetches by itself)",
    "fsdp_sync_module_states": "removed in FSDP2 (sharding from rank 0's weights is implicit)",
    "fsdp_use_orig_params": "removed in FSDP2 (parameters are always the original DTensors)",
    "fsdp_forward_prefetch": "not available in FSDP2 yet",
}


def convert_config_to_fsdp2(config: dict[str, Any]) -> dict[str, Any]:
    """`config` with its `fsdp_config` in FSDP2 form; returned unchanged when there is none or it is FSDP2."""
    fsdp = config.get("fsdp_config") or {}
    if not fsdp:
        logger.info("no fsdp_config in the config file: nothing to convert")
        return config
    if int(fsdp.get("fsdp_version", 1)) == 2:
        logger.warning("the config already says fsdp_version: 2; nothing converted")
        return config
    converted: dict[str, Any] = {}
    for key, value in fsdp.items():
        if key in DROPPED:
            logger.warning("%s: %s; dropped", key, DROPPED[key])
        elif key in ("fsdp_sharding_strategy", "fsdp_reshard_after_forward") and isinstance(value, str):
            converted["fsdp_reshard_after_forward"] = RESHARD_AFTER_FORWARD.get(value.upper(), value)
        else:
            converted[key] = value
    converted["fsdp_version"] = 2
    return {**config, "fsdp_config": converted}


def to_fsdp2_command_parser(subparsers: argparse._SubParsersAction | None = None) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    description = "Convert a config file's FSDP1 options to FSDP2"
    if subparsers is not None:
        parser = subparsers.add_parser("to-fsdp2", description=description, help=description)
    else:
        parser = argparse.ArgumentParser(prog="accelerando to-fsdp2", description=description)
    add_flag(parser, "config_file", required=True, help="the config file to convert")
    add_flag(
        parser, "overwrite", action="store_true", help="write over config_file (or an existing output_file)"
    )
    add_flag(
        parser,
        "output_file",
        default=None,
        help="where to write the result (default: config_file with --overwrite)",
    )
    parser.set_defaults(func=to_fsdp2_command)
    return parser


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    to_fsdp2_command_parser(sub)


def _validate_to_fsdp2_args(args: argparse.Namespace) -> None:
    if not Path(args.config_file).is_file():
        raise FileNotFoundError(f"config file {args.config_file!r} not found")
    if not args.overwrite and args.output_file is None:
        raise ValueError("give --output_file, or --overwrite to replace the config file")
    if not args.overwrite and Path(args.output_file).exists():
        raise FileExistsError(
            f"output file {args.output_file!r} already exists; pass --overwrite to replace it"
        )


def to_fsdp2_command(args: argparse.Namespace) -> int:
    _validate_to_fsdp2_args(args)
    config = read_mapping(Path(args.config_file))
    if not config:
        raise ValueError(f"config file {args.config_file!r} is empty")
    save_config(convert_config_to_fsdp2(dict(config)), args.output_file or args.config_file)
    return 0
