"""Device-map planning is pure and deterministic: same model and budget, same map."""

from __future__ import annotations

import warnings

import pytest
import torch
from bigmodel_toys import Toy

from accelerando.big_model.device_map import device_for, resolve_device_map
from accelerando.big_model.init import init_empty_weights
from accelerando.utils.modeling import (
    check_device_map,
    clean_device_map,
    compute_module_sizes,
    get_balanced_memory,
    get_max_memory,
    infer_auto_device_map,
)

BLOCK = 1184


def meta_toy(**kwargs: object) -> Toy:
    with init_empty_weights():
        return Toy(**kwargs)  # type: ignore[arg-type]


def test_get_max_memory_orders_and_converts() -> None:
    budget = get_max_memory({"cpu": "1KB", 1: 10, 0: "2KiB", "disk": 5})
    assert list(budget) == [0, 1, "cpu", "disk"]
    assert budget == {0: 2048, 1: 10, "cpu": 1000, "disk": 5}
    with pytest.raises(ValueError, match="'gpu'"):
        get_max_memory({"gpu": 10})
    measured = get_max_memory()
    assert measured["cpu"] > 0


def test_everything_fits_is_one_entry() -> None:
    assert infer_auto_device_map(meta_toy(), {"cpu": 10**6}) == {"": "cpu"}


def test_sequential_fill_with_disk_and_reserve() -> None:
    model = meta_toy()
    # cpu holds embed (512 B) and blocks.0 while keeping one block's room to run offloaded blocks;
    # the model's own buffers come last (after its children), as in Accelerate
    device_map = infer_auto_device_map(model, {"cpu": 3000}, no_split_module_classes=["Block"])
    assert device_map == {
        "embed": "cpu", "blocks.0": "cpu", "blocks.1": "disk", "blocks.2": "disk", "blocks.3": "disk",
        "head": "disk", "scale": "disk", "table": "disk",
    }  # fmt: skip
    assert infer_auto_device_map(model, {"cpu": 3000}, no_split_module_classes=["Block"]) == device_map
    # the room kept is for the largest layer still to place, so a budget that holds the model holds it all
    total = compute_module_sizes(model)[""]
    assert infer_auto_device_map(model, {"cpu": total}, no_split_module_classes=["Block"]) == {"": "cpu"}
    short = infer_auto_device_map(model, {"cpu": total - 1}, no_split_module_classes=["Block"])
    assert short == {"embed": "cpu", "blocks": "cpu", "head": "cpu", "scale": "cpu", "table": "disk"}


def test_accelerator_indices_planned_without_devices() -> None:
    model = meta_toy()
    budget = {0: 548 + 2 * BLOCK + 10, 1: 2 * BLOCK + 100, "cpu": 10**6}
    device_map = infer_auto_device_map(model, budget, no_split_module_classes=["Block"])
    assert device_map["embed"] == 0 and device_map["blocks.0"] == 0
    assert device_map["blocks.1"] == 1 and device_map["blocks.2"] == 1
    assert device_map["blocks.3"] == "cpu"
    check_device_map(model, device_map)


def test_no_split_class_is_never_cut() -> None:
    model = meta_toy()
    for no_split in (["Block"], []):
        device_map = infer_auto_device_map(
            model, {"cpu": 2500}, no_split_module_classes=no_split, clean_result=False
        )
        for name in device_map:
            if no_split:
                assert not name.startswith("blocks.0.")
        check_device_map(model, device_map)
    device_map = infer_auto_device_map(model, {"cpu": 2500}, no_split_module_classes=[], clean_result=False)
    assert any(name.startswith("blocks.") and name.count(".") >= 2 for name in device_map)


def test_tied_parameters_share_a_device() -> None:
    model = meta_toy(tie=True)
    device_map = infer_auto_device_map(model, {0: 700, "cpu": 10**6}, no_split_module_classes=["Block"])
    assert device_for("embed.weight", device_map) == device_for("head.weight", device_map)


def test_fallback_allocation_uses_a_device_the_next_module_skipped() -> None:
    model = meta_toy()
    budget = {0: 1200, 1: 0, "cpu": 10**6}  # device 0 keeps a block's room: embed (512 B) does not fit
    plain = infer_auto_device_map(model, budget, no_split_module_classes=["Block"])
    assert plain == {"": "cpu"}
    fallback = infer_auto_device_map(
        model, budget, no_split_module_classes=["Block"], fallback_allocation=True
    )
    assert fallback == {"scale": 0, "embed": "cpu", "blocks": "cpu", "head": "cpu", "table": "cpu"}
    check_device_map(model, fallback)


def test_verbose_explains_plan(capsys: pytest.CaptureFixture[str]) -> None:
    infer_auto_device_map(meta_toy(), {"cpu": 3000}, no_split_module_classes=["Block"], verbose=True)
    out = capsys.readouterr().out
    assert "cpu:" in out and "disk:" in out and "offloaded" in out
    assert "after keeping 1184 B to run offloaded layers" in out


def test_balanced_memory_spreads_over_accelerators() -> None:
    model = meta_toy()
    total = compute_module_sizes(model)[""]
    budget = get_balanced_memory(model, {0: 10**6, 1: 10**6, "cpu": 10**6}, ["Block"])
    # every accelerator but the last gets a share; the last keeps its budget for what is left
    assert budget[0] < total and budget[1] == 10**6 and budget["cpu"] == 10**6
    low = get_balanced_memory(model, {0: 10**6, 1: 10**6, "cpu": 10**6}, ["Block"], low_zero=True)
    assert low[0] == 0 and low[1] == 10**6  # the others hold everything: nothing needs device 0
    balanced = resolve_device_map(model, "balanced", {0: 10**6, 1: 10**6}, ["Block"])
    assert balanced is not None and {0, 1} <= set(balanced.values())
    assert get_balanced_memory(model, {"cpu": 100}) == {"cpu": 100}


def test_resolve_rejects_unknown_strategy() -> None:
    with pytest.raises(ValueError, match="'fastest'"):
        resolve_device_map(meta_toy(), "fastest")


def test_clean_device_map_merges_uniform_children() -> None:
    raw = {"a.0": "cpu", "a.1": "cpu", "b.x": 0, "b.y": "disk", "c": 0}
    assert clean_device_map(raw) == {"a": "cpu", "b.x": 0, "b.y": "disk", "c": 0}
    assert clean_device_map({"a.0": 0, "a.1": 0}) == {"": 0}


def test_check_device_map_names_uncovered_tensors() -> None:
    with pytest.raises(ValueError, match="head.weight"):
        check_device_map(meta_toy(), {"embed": "cpu", "blocks": "cpu", "scale": "cpu", "table": "cpu"})


def test_buffers_of_offloaded_modules_warn_when_no_accelerator_has_room() -> None:
    from torch import nn

    class Buffered(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(16, 16)  # 1088 B
            self.register_buffer("cache", torch.zeros(100))  # 400 B

    with init_empty_weights():
        model = nn.Sequential(*(Buffered() for _ in range(4)))
    budget = {
        0: 3000,
        "cpu": 10**6,
    }  # one block on 0 (it keeps a block's room); no room for 3 blocks' buffers
    with pytest.warns(UserWarning, match="requires 1200 bytes of buffer for offloaded layers"):
        kept = infer_auto_device_map(model, budget, no_split_module_classes=["Buffered"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        moved = infer_auto_device_map(
            model, budget, no_split_module_classes=["Buffered"], offload_buffers=True
        )
    # placement is the same either way (as in Accelerate): resident buffers are only warned about
    assert kept == moved == {"0": 0, "1": "cpu", "2": "cpu", "3": "cpu"}
