"""save_state(async_save=True) on 2 ranks (DDP, gloo), several checks in one launch.

1. An asynchronous save of the same state as a synchronous one writes the same bytes (every file's
   size and CRC-32 in the two manifests agree), while training goes on during the background write.
2. Resuming from the asynchronous checkpoint and repeating the steps gives bit-identical weights.
3. A background write that fails on rank 1 is raised on both ranks at the next call, naming the
   checkpoint; nothing of it remains, the previous checkpoint loads, and the next save works.
4. end_training waits for a pending save: the checkpoint is complete when it returns.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from accelerando import Accelerator
from accelerando.checkpoint import state_dict as sd_io
from accelerando.checkpoint.atomic import CheckpointError, is_complete
from accelerando.utils import set_seed


class Counter:
    def __init__(self) -> None:
        self.n = torch.zeros(3)

    def state_dict(self) -> dict:
        return {"n": self.n}

    def load_state_dict(self, state: dict) -> None:
        self.n.copy_(state["n"])


def steps(acc, model, opt, counter, n: int) -> None:
    for _ in range(n):
        acc.backward(model(torch.randn(8, 16)).pow(2).mean())
        opt.step()
        opt.zero_grad()
        counter.n += 1  # changed in place: a snapshot that shared memory would see it


def weights(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def files(ckpt: str) -> dict:
    return json.loads((Path(ckpt) / "manifest.json").read_text())["files"]


def main(out: Path) -> None:
    set_seed(3)
    acc = Accelerator()
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = acc.prepare(model, opt)
    counter = Counter()
    acc.register_for_checkpointing(counter)
    steps(acc, model, opt, counter, 3)

    # 1. same bytes, training during the write
    sync_dir = acc.save_state(str(out / "sync"))
    async_dir = acc.save_state(str(out / "async"), async_save=True)
    steps(acc, model, opt, counter, 4)  # runs while the background write may still be going
    after = weights(model)
    acc.load_state(async_dir)  # waits for the pending save first
    assert files(sync_dir) == files(async_dir), (files(sync_dir), files(async_dir))

    # 2. resume from the asynchronous checkpoint: the same four steps give the same weights
    steps(acc, model, opt, counter, 4)
    assert all(torch.equal(a, b) for a, b in zip(after, model.parameters()))
    assert torch.equal(counter.n, torch.full((3,), 7.0))

    # 3. a failing background write
    real_write = sd_io.write_data_file

    def failing(path: Path, obj: object) -> None:  # stays in place: the write happens later
        if acc.process_index == 1 and path.parent.name == ".broken.incomplete":
            raise OSError(28, "No space left on device (on purpose)", str(path))
        real_write(path, obj)

    sd_io.write_data_file = failing
    acc.save_state(str(out / "broken"), async_save=True)
    try:
        acc.save_state(str(out / "next"))
    except CheckpointError as err:
        assert "asynchronous save of" in str(err) and "broken" in str(err), str(err)
        if acc.process_index == 1:
            assert "no space left" in str(err).lower(), str(err)
    else:
        raise AssertionError("the failed background write was not raised")
    assert not (out / "broken").exists() and not (out / ".broken.incomplete").exists()
    acc.load_state(async_dir)
    acc.save_state(str(out / "next"), async_save=True)

    # 4. end_training waits
    acc.end_training()
    assert is_complete(out / "next")
    print(f"ASYNC ok rank {acc.process_index}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    main(Path(parser.parse_args().out))
