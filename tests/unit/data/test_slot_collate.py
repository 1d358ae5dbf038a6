"""Collating a receiver's batch straight into its ring buffer (pure, no processes)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.data import default_collate

from accelerando.data.batch_codec import Codec
from accelerando.data.slot_collate import SlotCollate, collate_into


def _samples(n: int = 5) -> list[Any]:
    return [
        {
            "image": torch.full((3, 4, 4), float(i)),
            "label": i,
            "weight": 0.5 * i,
            "ids": np.arange(6, dtype=np.int64) + i,
            "pair": (torch.arange(2) + i, torch.tensor(True)),
            "name": f"s{i}",
        }
        for i in range(n)
    ]


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_equal, a, b))
    return bool(a == b)


def _inside(t: torch.Tensor, buf: torch.Tensor) -> bool:
    return buf.data_ptr() <= t.data_ptr() < buf.data_ptr() + buf.numel()


def test_a_batch_collated_into_the_buffer_equals_default_collate_and_is_sent_without_a_copy() -> None:
    samples = _samples()
    buf = torch.zeros(1 << 14, dtype=torch.uint8)
    batch = collate_into(buf, samples)
    assert _equal(batch, default_collate(samples))
    tensors = [batch["image"], batch["label"], batch["weight"], batch["ids"], *batch["pair"]]
    assert all(_inside(t, buf) for t in tensors)
    packed = Codec().pack(batch)
    before = batch["image"].clone()
    packed.write(buf)  # every tensor already at its offset: only the header is written
    assert torch.equal(batch["image"], before)
    got = Codec().decode(buf[: packed.total].clone(), len(packed.header))
    assert _equal(got, default_collate(samples))


def test_what_does_not_fit_is_made_as_usual_and_copied_in_at_its_place() -> None:
    samples = _samples()
    buf = torch.zeros(256, dtype=torch.uint8)  # room for the first tensor's bytes only
    batch = collate_into(buf, samples)
    assert _equal(batch, default_collate(samples))
    packed = Codec().pack(batch)
    big = torch.zeros(packed.total, dtype=torch.uint8)
    packed.write(big)
    assert _equal(Codec().decode(big, len(packed.header)), default_collate(samples))


def test_a_tensor_elsewhere_in_the_buffer_is_moved_without_being_overwritten() -> None:
    buf = torch.zeros(4096, dtype=torch.uint8)
    inner = buf[1024 : 1024 + 64].view(torch.float32)  # lies where the message's header/data go
    inner.copy_(torch.arange(16, dtype=torch.float32))
    batch = (inner, torch.arange(16, dtype=torch.float32) * 2)
    packed = Codec().pack(batch)
    packed.write(buf)
    got = Codec().decode(buf[: packed.total].clone(), len(packed.header))
    assert torch.equal(got[0], torch.arange(16, dtype=torch.float32))
    assert torch.equal(got[1], torch.arange(16, dtype=torch.float32) * 2)


def test_rank_0s_own_batches_and_unknown_ranks_never_land_in_the_ring() -> None:
    buf = torch.zeros(1 << 14, dtype=torch.uint8)
    asked: list[int] = []

    def next_buffer(rank: int) -> torch.Tensor:
        asked.append(rank)
        return buf

    rank = [0]
    collate = SlotCollate(next_buffer, lambda: rank[0])
    samples = _samples()
    for r, inside in ((0, False), (-1, False), (1, True)):
        rank[0] = r
        batch = collate(samples)
        assert _equal(batch, default_collate(samples)) and _inside(batch["image"], buf) == inside
    assert asked == [1]
