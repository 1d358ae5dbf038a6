"""`accelerando merge-weights`: a sharded FSDP checkpoint -> (sharded) safetensors, offline.

The work is `accelerando.utils.fsdp_merge.merge_fsdp_weights` (also importable from
`accelerando.utils`); this module is only its command line.
"""

from __future__ import annotations

import argparse

from accelerando.commands._args import add_flag
from accelerando.utils.fsdp_merge import find_sharded_model, merge_fsdp_weights

__all__ = ["add_arguments", "find_sharded_model", "merge_fsdp_weights", "register", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "checkpoint_directory", help="a save_state folder, or one of its pytorch_model_fsdp_N folders"
    )
    parser.add_argument("output_path", help="folder to write the merged weights into")
    add_flag(parser, "unsafe_serialization", action="store_true", help="write pytorch_model.bin (pickle)")
    add_flag(
        parser, "remove_checkpoint_dir", action="store_true", help="delete the sharded folder afterwards"
    )
    add_flag(parser, "max_shard_size", default="10GB", help="largest output file (default 10GB)")
    parser.set_defaults(func=run)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    add_arguments(
        sub.add_parser(
            "merge-weights", help="merge a sharded FSDP checkpoint into safetensors (no process group needed)"
        )
    )


def run(args: argparse.Namespace) -> int:
    written = merge_fsdp_weights(
        args.checkpoint_directory,
        args.output_path,
        safe_serialization=not args.unsafe_serialization,
        remove_checkpoint_dir=args.remove_checkpoint_dir,
        max_shard_size=args.max_shard_size,
    )
    print(f"merged {len(written)} file(s) into {args.output_path}: {', '.join(written)}")
    return 0
