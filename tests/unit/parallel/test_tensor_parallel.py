"""The tensor-parallel plan: where it comes from, how style names translate, what is refused (no process)."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from accelerando.parallel.tensor_parallel import apply_tensor_parallel, model_plan, to_styles, unmatched_keys


def _llama() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2
    )
    return LlamaForCausalLM(config)


def test_a_transformers_model_brings_its_own_plan_and_every_key_matches() -> None:
    model = _llama()
    plan = model_plan(model)
    assert plan is not None and plan["model.layers.*.self_attn.q_proj"] == "colwise"
    assert plan["lm_head"] == "colwise_gather_output" and plan["model.embed_tokens"] == "embedding_rowwise"
    assert unmatched_keys(model, plan) == []
    styles = to_styles(plan)
    assert isinstance(styles["model.layers.*.mlp.down_proj"], RowwiseParallel)
    assert styles["lm_head"].output_layouts == (Replicate(),)
    assert model_plan(torch.nn.Linear(2, 2)) is None


def test_styles_pass_through_and_unknown_names_are_refused() -> None:
    style = ColwiseParallel()
    assert to_styles({"fc1": style})["fc1"] is style
    with pytest.raises(ValueError, match=r"'fc1': 'diagonal' is not a ParallelStyle .*colwise"):
        to_styles({"fc1": "diagonal"})


def test_keys_that_match_nothing_and_missing_plans_are_refused() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.Linear(4, 2))
    assert unmatched_keys(model, {"0": "colwise", "1": "rowwise", "2": "rowwise", "*": "x"}) == ["2"]

    class Mesh:
        def size(self) -> int:
            return 2

    with pytest.raises(ValueError, match=r"plan keys \['fc9'\] match no module of Sequential"):
        apply_tensor_parallel(model, Mesh(), {"fc9": ColwiseParallel()})
    with pytest.raises(ValueError, match="tp_size=2 but Sequential has no tensor-parallel plan"):
        apply_tensor_parallel(model, Mesh(), None)
