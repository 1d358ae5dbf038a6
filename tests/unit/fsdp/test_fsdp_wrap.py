"""Wrapping plans (pure: no process group) and the single-process fallback of the strategy."""

from __future__ import annotations

import pytest
import torch

from accelerando.config.fsdp import FullyShardedDataParallelPlugin as Plugin
from accelerando.parallel.grad_norm import total_grad_norm
from accelerando.strategies.fsdp_wrap import infer_block_classes, plan_wrapping


class Layer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)


class Tower(torch.nn.Module):
    def __init__(self, n: int = 3) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10, 8)
        self.layers = torch.nn.ModuleList(Layer() for _ in range(n))
        self.head = torch.nn.Linear(8, 10)


def test_repeated_blocks_are_inferred() -> None:
    plan = plan_wrapping(Tower(), Plugin())
    assert plan.classes == ("Layer",) * 3 and "repeated blocks" in plan.reason


def test_no_split_modules_win_over_repetition() -> None:
    model = Tower()
    model._no_split_modules = ["Linear"]  # type: ignore[assignment]
    names, source = infer_block_classes(model)
    assert names == ["Linear"] and source == "the model's _no_split_modules"


def test_explicit_classes_children_first_and_unknown_refused() -> None:
    plan = plan_wrapping(Tower(), Plugin(transformer_cls_names_to_wrap="Layer,Linear"))
    assert plan.classes.index("Linear") < plan.classes.index("Layer")
    with pytest.raises(ValueError, match="does not contain.*Layer"):
        plan_wrapping(Tower(), Plugin(transformer_cls_names_to_wrap=["DecoderLayer"]))


def test_size_based_follows_fsdp1_rule() -> None:
    # Linear(8, 8) has 72 parameters; a Layer 144.
    plan = plan_wrapping(Tower(), Plugin(auto_wrap_policy="size_based_wrap", min_num_params=100))
    assert plan.classes == ("Layer",) * 3
    plan = plan_wrapping(Tower(), Plugin(auto_wrap_policy="size_based_wrap", min_num_params=50))
    assert plan.classes.count("Linear") == 7 and "Layer" not in plan.classes


def test_no_wrap_and_callables() -> None:
    assert plan_wrapping(Tower(), Plugin(auto_wrap_policy="no_wrap")).modules == []
    plan = plan_wrapping(Tower(), Plugin(auto_wrap_policy=lambda m: isinstance(m, torch.nn.Embedding)))
    assert plan.classes == ("Embedding",)

    def fsdp1_style(module: torch.nn.Module, recurse: bool, nonwrapped_numel: int) -> bool:
        return not recurse and nonwrapped_numel >= 100 and isinstance(module, Layer)

    assert plan_wrapping(Tower(), Plugin(auto_wrap_policy=fsdp1_style)).classes == ("Layer",) * 3


def test_total_grad_norm_plain_tensors() -> None:
    grads = [torch.tensor([3.0, 0.0]), torch.tensor([4.0])]
    assert total_grad_norm(grads).item() == pytest.approx(5.0)
    assert total_grad_norm(grads, float("inf")).item() == pytest.approx(4.0)


def test_merge_weights_finds_the_sharded_model(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from accelerando.commands.merge_weights import find_sharded_model

    with pytest.raises(ValueError, match="not a folder"):
        find_sharded_model(tmp_path / "missing")
    with pytest.raises(ValueError, match="SHARDED_STATE_DICT"):
        find_sharded_model(tmp_path)
    for i in (0, 1):
        (tmp_path / f"pytorch_model_fsdp_{i}").mkdir()
        (tmp_path / f"pytorch_model_fsdp_{i}" / ".metadata").write_bytes(b"")
    with pytest.raises(ValueError, match="several models"):
        find_sharded_model(tmp_path)
    assert find_sharded_model(tmp_path / "pytorch_model_fsdp_1") == tmp_path / "pytorch_model_fsdp_1"


def test_units_follow_definition_order_and_outermost_chain() -> None:
    from accelerando.strategies.fsdp_wrap import outermost

    model = Tower()
    plan = plan_wrapping(model, Plugin(transformer_cls_names_to_wrap=["Layer", "Linear"]))
    layers = list(model.layers)
    assert [m for m in plan.modules if isinstance(m, Layer)] == layers
    assert plan.modules.index(layers[0].a) < plan.modules.index(layers[0])  # children first
    assert outermost(plan.modules) == [*layers, model.head]
