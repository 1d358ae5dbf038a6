"""compile_regions on a dispatched tiny Llama whose blocks live on disk: the same logits as uncompiled,
graphs really captured (dynamo runs eager silently on some modules, cpu-notes.md), the repeated
layers compiled once, no graph break on the offload hooks."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from torch._dynamo.utils import counters  # noqa: E402

from accelerando.big_modeling import init_empty_weights, load_checkpoint_and_dispatch  # noqa: E402
from accelerando.utils import compile_regions  # noqa: E402
from accelerando.utils.modeling import compute_module_sizes  # noqa: E402


def test_disk_offloaded_llama_compiled_regionally_gives_the_uncompiled_logits(tmp_path: Path) -> None:
    config = transformers.LlamaConfig(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    reference = transformers.LlamaForCausalLM(config).eval()
    reference.save_pretrained(tmp_path)
    with init_empty_weights():
        model = transformers.LlamaForCausalLM(config)
    model = load_checkpoint_and_dispatch(
        model, tmp_path, device_map="auto", max_memory={"cpu": compute_module_sizes(model)[""] // 3},
        no_split_module_classes=model._no_split_modules,
    ).eval()  # fmt: skip
    assert model.hf_device_map["model.layers"] == "disk"
    layers = model.model.layers
    assert all("_hf_hook" in block.__dict__ for block in layers)  # one offload hook per block
    prompt = torch.tensor([[5, 17, 3, 42, 8]])
    with torch.no_grad():
        expected = reference(prompt, use_cache=False).logits
        eager = model(prompt, use_cache=False).logits  # hooks read each block from disk
        torch._dynamo.reset()
        counters.clear()
        compile_regions(model, backend="aot_eager")  # dynamo capture is what is tested; inductor adds ~10 s
        start = time.perf_counter()
        first = model(prompt, use_cache=False).logits
        compile_s = time.perf_counter() - start
        frames = counters["frames"]["ok"]
        second = model(prompt, use_cache=False).logits
    print(f"compile_regions, aot_eager: first call (compiling) {compile_s:.2f} s")
    assert counters["stats"]["unique_graphs"] > 0, dict(counters["stats"])
    assert not counters["graph_break"], dict(counters["graph_break"])  # the hooks stay outside
    # at most five regions (embeddings, layers, final norm, rotary embedding, head; dynamo may inline a
    # small one, depending on what ran before in the process): the four layers share one compiled
    # frame; the second call compiles nothing new while the hooks swap the weights in and out
    assert 1 <= frames <= 5, dict(counters["frames"])
    assert counters["frames"]["ok"] == frames
    assert all(p.device.type == "meta" for p in layers.parameters())  # still offloaded between calls
    torch.testing.assert_close(first, eager, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(first, expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(first, second)
    assert list(model.state_dict()) == list(reference.state_dict())  # compiled in place: same keys
