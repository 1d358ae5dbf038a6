"""Sizes, tied parameters and file-size parsing: pure functions of the module tree."""

from __future__ import annotations

import pytest
import torch
from bigmodel_toys import Block, Toy
from torch import nn

from accelerando.big_model.init import init_empty_weights
from accelerando.utils.modeling import (
    calculate_maximum_sizes,
    compute_module_sizes,
    compute_module_total_buffer_size,
    convert_file_size_to_int,
    dtype_byte_size,
    find_tied_parameters,
    get_max_layer_size,
    get_non_persistent_buffers,
    named_module_tensors,
    retie_parameters,
)

BLOCK_BYTES = (8 * 16 + 16 + 16 * 8 + 8 + 2 * 8) * 4


def test_dtype_byte_size() -> None:
    assert dtype_byte_size(torch.float32) == 4
    assert dtype_byte_size(torch.bfloat16) == 2
    assert dtype_byte_size(torch.int8) == 1
    assert dtype_byte_size(torch.float8_e4m3fn) == 1
    with pytest.raises(TypeError, match="torch.dtype"):
        dtype_byte_size("float32")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "expected"),
    [("10GB", 10 * 10**9), ("10GiB", 10 * 2**30), ("500MB", 500 * 10**6), ("1KiB", 1024), ("8Gb", 10**9),
     ("123", 123), (2048, 2048), ("1.5GB", 1_500_000_000)],
)  # fmt: skip
def test_convert_file_size_to_int(text: str | int, expected: int) -> None:
    assert convert_file_size_to_int(text) == expected


@pytest.mark.parametrize("bad", ["ten gigs", "5XB", -1, 1.5])
def test_convert_file_size_rejects(bad: object) -> None:
    with pytest.raises((ValueError, TypeError), match="size"):
        convert_file_size_to_int(bad)  # type: ignore[arg-type]


def test_compute_module_sizes_counts_every_prefix_and_ties_once() -> None:
    with init_empty_weights():
        model = Toy(tie=True)
    sizes = compute_module_sizes(model)
    assert sizes["blocks.0"] == BLOCK_BYTES
    assert sizes["blocks"] == 4 * BLOCK_BYTES
    assert sizes["embed"] == 16 * 8 * 4
    assert sizes["head"] == 0  # its weight is the embedding's, counted there
    assert sizes[""] == 16 * 8 * 4 + 4 * BLOCK_BYTES + 4 + 8 * 4
    assert sizes["blocks.0.up.weight"] == 8 * 16 * 4


def test_compute_module_sizes_dtype_only_shrinks_floats() -> None:
    model = nn.Module()
    model.lin = nn.Linear(4, 4, bias=False)
    model.register_buffer("ids", torch.zeros(4, dtype=torch.int64))
    half = compute_module_sizes(model, dtype=torch.float16)
    assert half["lin"] == 16 * 2 and half["ids"] == 4 * 8
    assert compute_module_sizes(model.half(), dtype=torch.float32)["lin"] == 16 * 2
    special = compute_module_sizes(model.float(), dtype="float16", special_dtypes={"lin.weight": torch.int8})
    assert special["lin"] == 16
    assert compute_module_total_buffer_size(model) == 32
    with pytest.raises(ValueError, match="not a torch dtype"):
        compute_module_sizes(model, dtype="float17")


def test_find_and_retie_parameters() -> None:
    model = Toy(tie=True)
    assert find_tied_parameters(model) == [["embed.weight", "head.weight"]]
    assert find_tied_parameters(Toy()) == []
    model.head.weight = nn.Parameter(torch.zeros(16, 8))
    retie_parameters(model, [["embed.weight", "head.weight"]])
    assert model.head.weight is model.embed.weight


def test_max_layer_size_respects_no_split() -> None:
    model = Toy()
    sizes = compute_module_sizes(model)
    size, names = get_max_layer_size(list(model.named_children()), sizes, ["Block"])
    assert size == BLOCK_BYTES and names == [f"blocks.{i}" for i in range(4)]
    size, names = get_max_layer_size(list(model.named_children()), sizes, [])
    assert names == [f"blocks.{i}.up" for i in range(4)] and size == 576
    total, (largest, _) = calculate_maximum_sizes(model)
    assert total == sizes[""] and largest == 576


def test_named_module_tensors_and_non_persistent() -> None:
    model = Toy()
    assert get_non_persistent_buffers(model) == {"table"}
    assert get_non_persistent_buffers(model, recurse=True, fqns=True) == {"table"}
    names = [n for n, _ in named_module_tensors(model, remove_non_persistent=True)]
    assert names == ["scale"]
    assert [n for n, _ in named_module_tensors(Block(2), recurse=True)][:2] == ["up.weight", "up.bias"]
