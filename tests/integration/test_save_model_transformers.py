"""`Accelerator.save_model` writes sharded safetensors that transformers' `from_pretrained` loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from accelerando import Accelerator  # noqa: E402


def _tiny_llama(tie: bool) -> torch.nn.Module:
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=tie,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


@pytest.mark.parametrize("tie", [True, False])
def test_sharded_save_loads_with_from_pretrained(tmp_path: Path, tie: bool) -> None:
    acc = Accelerator(cpu=True)
    model = acc.prepare(_tiny_llama(tie))
    acc.save_model(model, str(tmp_path), max_shard_size="20KB")
    model.config.save_pretrained(str(tmp_path))
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shards = sorted(p.name for p in tmp_path.glob("model-*.safetensors"))
    assert len(shards) > 2 and sorted(set(index["weight_map"].values())) == shards
    assert ("lm_head.weight" in index["weight_map"]) is not tie  # a tied tensor is stored once
    loaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path))
    want = acc.unwrap_model(model).state_dict()
    got = loaded.state_dict()
    assert set(got) == set(want)
    assert all(torch.equal(got[k], v) for k, v in want.items())
    if tie:
        assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()
    ids = torch.arange(10).unsqueeze(0)
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, acc.unwrap_model(model)(ids).logits)
