"""`attach_layerwise_casting_hooks` against Accelerate's on the same model and input: the same
layers hooked (and skipped), the same stored dtypes, the same outputs bit for bit."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch import nn

from accelerando.big_modeling import attach_layerwise_casting_hooks as ours

theirs = pytest.importorskip("accelerate.big_modeling").attach_layerwise_casting_hooks


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.conv = nn.Conv1d(8, 8, 3, padding=1)
        self.block = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
        self.norm = nn.LayerNorm(8)
        self.head = nn.Linear(8, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        x = self.conv(x.transpose(1, 2)).transpose(1, 2)
        return self.head(self.norm(self.block(x)))


CASES = [
    {},
    {"skip_modules_pattern": ("head", r"block\.0")},
    {"skip_modules_pattern": "conv"},
    {"skip_modules_classes": (nn.Sequential,)},
]


@pytest.mark.parametrize("options", CASES)
@pytest.mark.parametrize("storage", [torch.float8_e4m3fn, torch.float16])
def test_layerwise_casting_equals_accelerate(options: dict, storage: torch.dtype) -> None:
    torch.manual_seed(0)
    model = Net().to(torch.bfloat16)
    mine, reference = copy.deepcopy(model), copy.deepcopy(model)
    ours(mine, storage_dtype=storage, compute_dtype=torch.bfloat16, **options)
    if isinstance(options.get("skip_modules_pattern"), str):
        # One pattern given as a string: Accelerate iterates its characters (each one a pattern,
        # skipping nearly everything); here it is the one pattern, as its type hint says.
        options = {**options, "skip_modules_pattern": (options["skip_modules_pattern"],)}
    theirs(reference, storage_dtype=storage, compute_dtype=torch.bfloat16, **options)
    stored = {n: p.dtype for n, p in reference.named_parameters()}
    assert {n: p.dtype for n, p in mine.named_parameters()} == stored
    assert storage in stored.values() and torch.bfloat16 in stored.values()  # some cast, some kept
    ids = torch.randint(0, 10, (2, 5))
    with torch.no_grad():
        assert torch.equal(mine(ids), reference(ids))
    assert {n: p.dtype for n, p in mine.named_parameters()} == stored  # back to storage after forward


def test_a_compiled_model_casts_outside_the_graph_and_equals_the_uncompiled_one() -> None:
    """Compiling a model with casting hooks keeps the uncompiled results and the stored dtypes (the
    hooks' casts are excluded from compilation lazily, so importing the library loads no compiler)."""
    torch.manual_seed(0)
    model = Net().to(torch.bfloat16)
    ours(model, storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.bfloat16)
    ids = torch.randint(0, 10, (2, 5))
    with torch.no_grad():
        expected = model(ids)
        compiled = torch.compile(model, backend="eager")
        assert torch.equal(compiled(ids), expected)
        assert torch.equal(compiled(ids), expected)
    assert {p.dtype for p in model.block.parameters()} == {torch.float8_e4m3fn}


def test_a_copied_or_pickled_model_casts_with_its_own_hooks() -> None:
    """A hook holds no per-instance functions: a deep copy's hooks follow the copy's settings, and a
    model with hooks pickles (both broke while the hooks bound wrapped methods per instance)."""
    torch.manual_seed(0)
    model = Net().to(torch.bfloat16)
    ours(model, storage_dtype=torch.float16, compute_dtype=torch.bfloat16)
    copied = copy.deepcopy(model)
    copied.head._hf_hook.compute_dtype = torch.float32
    copied.head._hf_hook.pre_forward(copied.head)
    assert copied.head.weight.dtype == torch.float32
    assert model.head.weight.dtype == torch.float16
    restored = pickle.loads(pickle.dumps(model))
    ids = torch.randint(0, 10, (2, 5))
    with torch.no_grad():
        assert torch.equal(restored(ids), model(ids))
    assert restored.head.weight.dtype == torch.float16
