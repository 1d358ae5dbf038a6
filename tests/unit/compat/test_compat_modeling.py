"""utils.modeling / utils.memory additions, compared with Accelerate's implementations."""

from __future__ import annotations

from pathlib import Path

import accelerate.utils.memory as their_memory
import accelerate.utils.modeling as their_modeling
import pytest
import torch
from torch import nn

import accelerando.utils.memory as our_memory
import accelerando.utils.modeling as our_modeling
from accelerando.big_modeling import cpu_offload, disk_offload, dispatch_model


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.body = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 4))
        self.norm = nn.BatchNorm1d(4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("mask", torch.tensor([True, False, True]))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.body(self.embed(ids))))


DTYPES = [
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
    torch.float32, torch.float64, torch.complex64, torch.float8_e4m3fn, torch.float8_e5m2,
]  # fmt: skip


def test_dtype_byte_size_matches_accelerate_bool_is_an_eighth() -> None:
    for dtype in DTYPES:
        assert our_modeling.dtype_byte_size(dtype) == their_modeling.dtype_byte_size(dtype), dtype
    assert our_modeling.dtype_byte_size(torch.bool) == 1 / 8


def test_get_module_size_with_ties_matches_accelerate() -> None:
    model = Net()
    sizes = our_modeling.compute_module_sizes(model)
    treat = list(model.named_children())
    for tied, size in ([], 100), (["head.weight"], sizes["embed"]), (["embed.weight"], sizes["head"]):
        mine = our_modeling.get_module_size_with_ties(tied, size, sizes, treat)
        reference = their_modeling.get_module_size_with_ties(tied, size, sizes, treat)
        assert mine[0] == reference[0] and mine[1] == reference[1]
        assert all(a is b for a, b in zip(mine[2], reference[2]))
    assert our_modeling.get_module_size_with_ties(["head.weight"], 64, sizes, treat)[1] == ["head"]
    with pytest.raises(ValueError, match="'nowhere.weight' is in none"):
        our_modeling.get_module_size_with_ties(["nowhere.weight"], 1, sizes, treat)


def _reference_state(seed: int = 0) -> tuple[Net, dict[str, torch.Tensor]]:
    torch.manual_seed(seed)
    model = Net().eval()
    return model, {k: v.clone() for k, v in model.state_dict().items()}


def _assert_same_state(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for key in want:
        assert got[key].device.type == "cpu" and torch.equal(got[key], want[key]), key


def test_get_state_dict_offloaded_model_cpu_disk_and_block_offload(tmp_path: Path) -> None:
    model, want = _reference_state()
    cpu_offload(model, execution_device="cpu")
    assert model.body[0].weight.device.type == "meta"
    _assert_same_state(our_modeling.get_state_dict_offloaded_model(model), want)
    assert model.body[0].weight.device.type == "meta"  # brought back to its offloaded state

    model, want = _reference_state(1)
    disk_offload(model, tmp_path / "disk", execution_device="cpu")
    _assert_same_state(our_modeling.get_state_dict_offloaded_model(model), want)

    model, want = _reference_state(2)
    device_map = {"embed": "cpu", "body": "disk", "norm": "cpu", "head": "cpu", "mask": "cpu"}
    dispatch_model(model, device_map, offload_dir=tmp_path / "blocks")
    _assert_same_state(our_modeling.get_state_dict_offloaded_model(model), want)


def test_get_state_dict_offloaded_model_leaves_meta_tensors_out(caplog: pytest.LogCaptureFixture) -> None:
    model, want = _reference_state()
    model.body[2].bias = nn.Parameter(torch.empty(4, device="meta"))
    got = our_modeling.get_state_dict_offloaded_model(model)
    assert "body.2.bias" not in got and got.keys() == want.keys() - {"body.2.bias"}
    assert "body.2.bias" in caplog.text and "still on meta device" in caplog.text


def test_get_state_dict_from_offload_fills_the_modules_entries() -> None:
    model, want = _reference_state()
    cpu_offload(model, execution_device="cpu")
    layer = model.body[0]
    state = {"body.0.weight": "placeholder", "body.0.bias": "placeholder", "other": "kept"}
    our_modeling.get_state_dict_from_offload(layer, "body.0.weight", state)
    assert torch.equal(state["body.0.weight"], want["body.0.weight"])  # type: ignore[arg-type]
    assert torch.equal(state["body.0.bias"], want["body.0.bias"])  # type: ignore[arg-type]
    assert state["other"] == "kept" and layer.weight.device.type == "meta"
    plain = nn.Linear(2, 2)
    filled = our_modeling.get_state_dict_from_offload(plain, "lin.weight", {"lin.weight": "x"})
    assert filled["lin.weight"] is plain.state_dict()["weight"] or torch.equal(
        filled["lin.weight"], plain.weight
    )


@pytest.fixture(autouse=True)
def _no_gc_between_tries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both libraries run gc.collect() after each OOM; seconds per test here, and no effect on sizes."""
    for module in (our_memory, their_memory):
        monkeypatch.setattr(module, "clear_device_cache", lambda garbage_collection=False: None)


def _tried_sizes(module, start: int, fits: int, calls: int = 1) -> tuple[list[int], str]:
    tried: list[int] = []

    @module.find_executable_batch_size(starting_batch_size=start)
    def train(batch_size: int, tag: str) -> int:
        tried.append(batch_size)
        if batch_size > fits:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return batch_size

    outcome = ""
    for _ in range(calls):
        try:
            train("x")
        except RuntimeError as err:
            outcome = str(err)
    return tried, outcome


@pytest.mark.parametrize(
    ("start", "fits", "calls"), [(128, 40, 1), (128, 40, 2), (100, 1, 1), (17, 0, 1), (8, 8, 1)]
)
def test_find_executable_batch_size_tries_the_same_sizes_as_accelerate(
    start: int, fits: int, calls: int
) -> None:
    mine = _tried_sizes(our_memory, start, fits, calls)
    assert mine == _tried_sizes(their_memory, start, fits, calls)
    if (start, fits) == (128, 40):
        assert mine[0][:5] == [128, 115, 103, 92, 82]  # x 0.9, rounded down
        if calls == 2:
            assert mine[0][-2:] == [36, 36]  # the second call starts from the size that fitted
    if fits == 0:
        assert mine[1] == "No executable batch size found, reached zero."


def test_find_executable_batch_size_custom_reduction_and_misuse() -> None:
    tried: list[int] = []
    sizes = iter([50, 10])

    @our_memory.find_executable_batch_size(starting_batch_size=64, reduce_batch_size_fn=lambda: next(sizes))
    def train(batch_size: int) -> int:
        tried.append(batch_size)
        if batch_size > 10:
            raise torch.OutOfMemoryError("CUDA out of memory.")
        return batch_size

    assert train() == 10 and tried == [64, 50, 10]
    with pytest.raises(TypeError, match="Batch size was passed"):
        train(32)

    @our_memory.find_executable_batch_size(starting_batch_size=4)
    def broken(batch_size: int) -> None:
        raise ValueError("not memory")

    with pytest.raises(ValueError, match="not memory"):
        broken()
