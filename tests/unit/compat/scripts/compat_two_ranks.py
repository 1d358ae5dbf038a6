"""Run on 2 ranks: copy_tensor_to_devices, save (main process only), nested-tensor padding, debug
mode's shape check, save_state refusing per-rank directories, rng_types synchronisation at each
pass start of a prepared loader."""

import sys
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from accelerando import Accelerator
from accelerando.checkpoint.atomic import CheckpointError
from accelerando.data import prepare_data_loader
from accelerando.state import PartialState
from accelerando.utils import (
    CannotPadNestedTensorWarning,
    DistributedOperationException,
    copy_tensor_to_devices,
    pad_across_processes,
    save,
)

state = PartialState()
rank = state.process_index
folder = Path(sys.argv[1])

# One rank holds the tensor; the other does not know its shape or dtype.
source = torch.arange(6.0).reshape(2, 3) * 7
out = copy_tensor_to_devices(source if rank == 1 else None)
assert torch.equal(out, source) and out.dtype == torch.float32, out
ints = copy_tensor_to_devices(torch.tensor([5, 6], dtype=torch.int64) if rank == 0 else None)
assert torch.equal(ints, torch.tensor([5, 6])) and ints.dtype == torch.int64
try:
    copy_tensor_to_devices(torch.ones(1))
except DistributedOperationException as err:
    assert "processes [0, 1] hold one" in str(err), err
else:
    raise AssertionError("two holders accepted")

# save() writes from the main process only.
save({"rank": rank}, folder / "main.pt")
save({"rank": rank}, folder / f"rank{rank}.pt", save_on_each_node=True)
state.wait_for_everyone()
assert torch.load(folder / "main.pt")["rank"] == 0
assert (folder / "rank0.pt").exists() and not (folder / "rank1.pt").exists()

# Padding evens out ordinary tensors and leaves nested ones, with Accelerate's warning.
nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(rank + 1)])
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    padded = pad_across_processes({"n": nested, "t": torch.ones(rank + 1)}, pad_index=-1)
assert padded["n"] is nested and padded["t"].tolist() == ([1.0, -1.0] if rank == 0 else [1.0, 1.0])
assert any(issubclass(w.category, CannotPadNestedTensorWarning) for w in caught)

# Debug mode (Accelerate's op checker): mismatched shapes raise naming each process's shapes.
state.debug = True
try:
    pad_across_processes(torch.ones([1] * (rank + 1)))
except DistributedOperationException as err:
    assert "Process 0: [1]" in str(err) and "Process 1: [1, 1]" in str(err), err
else:
    raise AssertionError("debug mode let mismatched shapes through")
state.debug = False

# A checkpoint is one directory: ranks naming different ones are refused on every rank.
accelerator = Accelerator(cpu=True)
try:
    accelerator.save_state(str(folder / f"ckpt_rank{rank}"))
except CheckpointError as err:
    assert "every rank must save into the same directory" in str(err) and "ckpt_rank1" in str(err), err
else:
    raise AssertionError("differing save_state directories accepted")
assert not (folder / "ckpt_rank0").exists()
state.wait_for_everyone()


# rng_types (Accelerate's): a shard loader gives every rank rank 0's torch RNG state at each pass
# start; without "torch" in them the ranks' global RNGs stay their own.
def ranks_draw_alike() -> bool:
    draws = torch.rand(3)
    both = [torch.zeros(3), torch.zeros(3)]
    dist.all_gather(both, draws)
    return torch.equal(both[0], both[1])


for rng_types, synced in ((None, False), (["generator"], False), (["torch"], True)):
    loader = prepare_data_loader(DataLoader(list(range(8)), batch_size=2), rng_types=rng_types)
    for _pass in range(2):  # every pass start synchronises, not only the first
        torch.manual_seed(100 + rank)
        assert len(list(loader)) == 2
        assert ranks_draw_alike() is synced, (rng_types, _pass)
accelerator_loader = accelerator.prepare(DataLoader(list(range(8)), batch_size=2))
assert accelerator_loader.rng_types == ["generator"], accelerator_loader.rng_types  # Accelerate's default
torch.manual_seed(100 + rank)
list(accelerator_loader)
assert not ranks_draw_alike()
print(f"compat checks passed on rank {rank}")
