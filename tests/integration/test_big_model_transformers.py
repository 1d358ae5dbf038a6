"""Real transformers models through load_checkpoint_and_dispatch with part of them on disk."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from accelerando.big_modeling import init_empty_weights, load_checkpoint_and_dispatch  # noqa: E402
from accelerando.utils.modeling import compute_module_sizes  # noqa: E402


def tiny_llama() -> transformers.PretrainedConfig:
    return transformers.LlamaConfig(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False,
    )  # fmt: skip


def tiny_gpt2() -> transformers.PretrainedConfig:
    return transformers.GPT2Config(vocab_size=96, n_embd=32, n_layer=4, n_head=4, n_positions=64)


@pytest.mark.parametrize(
    ("make_config", "model_cls"),
    [(tiny_llama, "LlamaForCausalLM"), (tiny_gpt2, "GPT2LMHeadModel")],
    ids=["llama", "gpt2-tied"],
)
def test_generate_with_disk_offload_matches_in_memory(tmp_path: Path, make_config, model_cls: str) -> None:  # type: ignore[no-untyped-def]
    cls = getattr(transformers, model_cls)
    config = make_config()
    torch.manual_seed(0)
    reference = cls(config).eval()
    reference.save_pretrained(tmp_path)
    prompt = torch.tensor([[5, 17, 3, 42, 8]])
    expected = reference.generate(prompt, max_new_tokens=6, do_sample=False, pad_token_id=0)

    with init_empty_weights():
        model = cls(config)
    budget = compute_module_sizes(model)[""] // 3
    model = load_checkpoint_and_dispatch(
        model, tmp_path, device_map="auto", max_memory={"cpu": budget},
        no_split_module_classes=model._no_split_modules,
    )  # fmt: skip
    assert "disk" in model.hf_device_map.values() and "cpu" in model.hf_device_map.values()
    assert any(p.device.type == "meta" for p in model.parameters())
    model.eval()
    got = model.generate(prompt, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(got, expected)
    with torch.no_grad():
        torch.testing.assert_close(model(prompt).logits, reference(prompt).logits)
