"""Runs notebook_launcher / debug_launcher in a fresh process (they fork this one)."""

import os
import sys

import torch
import torch.distributed as dist

from accelerando.launchers import debug_launcher, notebook_launcher


def say(line: str) -> None:
    """One write per line, so lines of concurrent ranks never interleave."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def work(scale: float) -> None:
    dist.init_process_group("gloo")
    total = torch.ones(1) * scale
    dist.all_reduce(total)
    say(f"NB rank {dist.get_rank()} sum {total.item()} cpu {os.environ.get('ACCELERANDO_USE_CPU')}")
    dist.destroy_process_group()


class Boom(Exception):
    pass


def bad() -> None:
    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        raise Boom("rank one exploded")
    dist.barrier()


def via_accelerator() -> None:
    from accelerando import Accelerator

    acc = Accelerator()
    value = acc.reduce(torch.tensor([1.0]), reduction="sum").item()
    say(f"ACC rank {acc.process_index} of {acc.num_processes} {acc.distributed_type} sum {value}")


if __name__ == "__main__":
    notebook_launcher(work, (3.0,), num_processes=2)
    debug_launcher(via_accelerator)
    try:
        debug_launcher(bad)
    except Boom as err:
        notes = "\n".join(getattr(err, "__notes__", []))
        say(f"CAUGHT {err!r} on-rank-1={'raised on rank 1' in notes}")
    else:
        raise SystemExit("debug_launcher did not re-raise")
