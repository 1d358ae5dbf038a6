"""Fresh processes: restore the loader states data_modes.py saved after 7 batches, compare the rest.

Usage: torchrun --nproc_per_node=2 data_resume.py STATE_DIR
Each rank builds its loaders anew with a different torch seed (so only the saved state can make
the order right), loads its own state and must yield exactly the batches the original had left.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import data_modes as dm
import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    dm.RANK, dm.WORLD = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(9000 + dm.RANK)  # the saved seed, not this one, must decide the order
    folder = Path(sys.argv[1])
    checked = 0
    for name, stateful in itertools.product(dm.STATE_CASES, (False, True)):
        saved = torch.load(folder / f"{name}_{int(stateful)}_rank{dm.RANK}.pt", weights_only=False)
        loader = dm.make_state_loader(name, stateful)
        loader.load_state_dict(saved["state"])
        assert loader.epoch == 1
        rest = dm.drain(loader)
        assert rest == saved["rest"], (name, stateful, rest, saved["rest"])
        assert loader.epoch == 2 and loader.state_dict()["batches"] == 0
        assert dm.drain(loader) == saved["next"], (name, stateful, "next epoch")
        checked += 1
    dist.barrier()
    if dm.RANK == 0:
        print(f"data resume passed ({checked} loaders per rank)")


if __name__ == "__main__":
    main()
