"""The dispatch byte format and the default slicer (pure, no processes)."""

from __future__ import annotations

from collections import namedtuple

import pytest
import torch
from torch.utils.data import DataLoader

from accelerando.config.options import DataLoaderConfiguration as Config
from accelerando.data.batch_codec import Codec, copy_bytes
from accelerando.data.dispatch import batch_length, slice_batch
from accelerando.data.prepare import prepare_data_loader

Pair = namedtuple("Pair", "a b")


def test_encode_decode_roundtrip_keeps_structure_dtypes_and_values() -> None:
    batch = {
        "x": torch.randn(3, 4)[:, ::2],  # not contiguous
        "mask": torch.tensor([True, False, True]),
        "half": torch.ones(3, dtype=torch.bfloat16),
        "scalar": torch.tensor(7),
        "empty": torch.empty(0, 5),
        "names": ["a", "b", "c"],
        "pair": Pair(torch.arange(3), 1.5),
    }
    packed = Codec().pack(batch)
    buf = torch.empty(packed.total, dtype=torch.uint8)
    packed.write(buf)
    out = Codec().decode(buf, len(packed.header))
    assert out.keys() == batch.keys() and out["names"] == ["a", "b", "c"]
    assert isinstance(out["pair"], Pair) and out["pair"].b == 1.5
    for key in ("x", "mask", "half", "scalar", "empty"):
        assert out[key].dtype == batch[key].dtype and torch.equal(out[key], batch[key])
    assert torch.equal(out["pair"].a, torch.arange(3))


@pytest.mark.parametrize(
    "src",
    [
        torch.arange(12, dtype=torch.float32).reshape(3, 4),  # plain: libc memmove
        torch.arange(12, dtype=torch.float32).reshape(3, 4)[1:],  # storage offset
        torch.arange(12, dtype=torch.float32).reshape(3, 4).t(),  # strided: torch copies
        torch.tensor([1 + 2j, 3 - 4j]).conj(),  # conjugate bit: torch resolves it
        torch.tensor([1 + 2j, 3 - 4j]).conj().imag,  # negative bit
        torch.tensor([True, False, True]),
    ],
    ids=["plain", "offset", "strided", "conj", "neg", "bool"],
)
def test_copy_bytes_copies_the_values_whatever_the_view(src: torch.Tensor) -> None:
    dst = torch.zeros(src.numel() * src.element_size(), dtype=torch.uint8)
    copy_bytes(dst, src)
    assert torch.equal(dst.view(src.dtype).view(src.shape), src.resolve_conj().resolve_neg())


def test_slice_batch_cuts_the_batch_dimension_only() -> None:
    batch = {"x": torch.arange(8).view(4, 2), "names": list("wxyz"), "fields": (torch.arange(4), "tag")}
    assert batch_length(batch) == 4
    part = slice_batch(batch, slice(2, 4), 4)
    assert part["x"].tolist() == [[4, 5], [6, 7]] and part["names"] == ["y", "z"]
    assert part["fields"][0].tolist() == [2, 3] and part["fields"][1] == "tag"


def test_dispatch_on_one_process_is_the_plain_loader() -> None:
    dl = DataLoader(list(range(7)), batch_size=3)
    loader = prepare_data_loader(
        dl,
        num_processes=1,
        process_index=0,
        device=None,
        config=Config(dispatch_batches=True),
        gradient_state=None,
    )
    assert [b.tolist() for b in loader] == [[0, 1, 2], [3, 4, 5], [6]] and len(loader) == 3


def test_remote_codec_roundtrip_through_this_process_memory() -> None:
    """What a cross-memory receiver rebuilds, read back from our own address space."""
    import os

    batch = {
        "x": torch.randn(3, 4)[:, ::2],  # not contiguous: sent from a contiguous copy kept alive
        "half": torch.ones(3, dtype=torch.bfloat16),
        "scalar": torch.tensor(7),
        "empty": torch.empty(0, 5),
        "names": ["a", "b", "c"],
        "pair": Pair(torch.arange(3), 1.5),
    }
    sender, receiver = Codec(), Codec()
    for step in range(2):  # twice: what either side caches must not go stale
        batch["scalar"] = torch.tensor(step)
        packed = sender.pack_addresses(batch)
        out = receiver.read(packed.header, packed.where, os.getpid(), pin=False)
        assert out.keys() == batch.keys() and out["names"] == ["a", "b", "c"]
        assert isinstance(out["pair"], Pair) and out["pair"].b == 1.5
        for key in ("x", "half", "scalar", "empty"):
            assert out[key].dtype == batch[key].dtype and torch.equal(out[key], batch[key])
        assert torch.equal(out["pair"].a, torch.arange(3)) and len(packed.tensors) == 5


def test_remote_codec_reuses_a_description_only_for_the_same_structure() -> None:
    codec = Codec()
    first = codec.pack_addresses((torch.zeros(2), torch.ones(3))).header
    assert codec.pack_addresses((torch.zeros(2), torch.ones(3))).header is first
    assert codec.pack_addresses((torch.zeros(3), torch.ones(3))).header != first  # shapes changed
    assert codec.pack_addresses([torch.zeros(3), torch.ones(3)]).header != first  # container changed


def test_cross_memory_reads_open_rank_0_only_when_asked() -> None:
    """Unset: read rank 0 where the system already allows it (None); 1: rank 0 opens itself; 0: never."""
    from accelerando.config import env

    assert env.dispatch_cross_memory({}) is None
    assert env.dispatch_cross_memory({"ACCELERANDO_DISPATCH_CROSS_MEMORY": "0"}) is False
    assert env.dispatch_cross_memory({"ACCELERANDO_DISPATCH_CROSS_MEMORY": "1"}) is True
    assert env.dispatch_cross_memory({"ACCELERATE_DISPATCH_CROSS_MEMORY": "true"}) is True
    with pytest.raises(ValueError, match="ACCELERANDO_DISPATCH_CROSS_MEMORY='maybe'"):
        env.dispatch_cross_memory({"ACCELERANDO_DISPATCH_CROSS_MEMORY": "maybe"})
