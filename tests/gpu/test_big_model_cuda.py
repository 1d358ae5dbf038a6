"""Big-model loading and offloaded forwards on CUDA (run on the GPU machine: `pytest -m cuda tests/gpu`).

Loading goes through the loader threads (pinned chunks, asynchronous copies into memory reserved up
front) and offloaded blocks through the side-stream prefetcher; both must give exactly the stored
tensors and exactly the all-on-GPU forward.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from accelerando.big_model import prefetch  # noqa: E402
from accelerando.big_modeling import init_empty_weights, load_checkpoint_and_dispatch  # noqa: E402

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

LAYERS = 6


def config() -> transformers.LlamaConfig:
    # a 40k x 128 embedding is 20 MB in fp32: several 8 MB staging chunks
    return transformers.LlamaConfig(
        vocab_size=40_000, hidden_size=128, intermediate_size=352, num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=False,
    )  # fmt: skip


def saved(folder: Path, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config()).to(dtype).eval()
    model.save_pretrained(folder, max_shard_size="8MB")
    return {k: v.clone() for k, v in model.state_dict().items()}


def empty_model() -> transformers.LlamaForCausalLM:
    with init_empty_weights():
        return transformers.LlamaForCausalLM(config()).eval()


def ids() -> torch.Tensor:
    return torch.randint(0, 40_000, (2, 48), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize(
    ("stored", "dtype"), [(torch.bfloat16, torch.bfloat16), (torch.float32, torch.bfloat16)]
)
def test_gpu_only_map_holds_exactly_the_stored_tensors(
    tmp_path: Path, stored: torch.dtype, dtype: torch.dtype
) -> None:
    state = saved(tmp_path, stored)
    model = load_checkpoint_and_dispatch(empty_model(), tmp_path, device_map="auto", dtype=dtype)
    assert set(model.hf_device_map.values()) == {0}
    loaded = model.state_dict()
    for name, value in state.items():
        got = loaded[name]
        assert got.device == torch.device("cuda", 0) and got.dtype == dtype, name
        assert torch.equal(got.cpu(), value.to(dtype)), name  # the host cast, as .to(device, dtype) does
    assert all(isinstance(p, torch.nn.Parameter) for p in model.parameters())


def test_gpu_cpu_disk_map_loads_and_forwards_exactly_like_all_on_gpu(tmp_path: Path) -> None:
    state = saved(tmp_path / "ckpt", torch.bfloat16)
    on_gpu = load_checkpoint_and_dispatch(empty_model(), tmp_path / "ckpt", device_map={"": 0})
    device_map = {"model.embed_tokens": 0, "model.rotary_emb": 0, "model.norm": "disk", "lm_head": "cpu"}
    device_map |= {f"model.layers.{i}": (0 if i < 2 else "cpu" if i < 4 else "disk") for i in range(LAYERS)}
    model = load_checkpoint_and_dispatch(
        empty_model(), tmp_path / "ckpt", device_map=device_map, offload_folder=tmp_path / "off"
    )
    for name, value in model.state_dict().items():
        if value.device.type == "cuda":
            assert torch.equal(value.cpu(), state[name]), name
    assert model.model.layers[4].mlp.up_proj.weight.device.type == "meta"
    with torch.no_grad():
        expected = on_gpu(ids().cuda()).logits
        torch.cuda.synchronize()
        for _ in range(2):  # the second call starts with the first offloaded block prefetched
            assert torch.equal(model(ids().cuda()).logits, expected)
        torch.cuda.synchronize()
        held = torch.cuda.memory_allocated()
        for _ in range(3):
            assert torch.equal(model(ids().cuda()).logits, expected)
        torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == held  # no device memory kept from one forward to the next
    fetcher = prefetch.fetcher_for(torch.device("cuda", 0))
    assert fetcher is not None and fetcher.stream != torch.cuda.current_stream()
