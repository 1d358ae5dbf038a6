"""Device-map planning and model sizing equal Accelerate's on the same models and budgets.

The reference is the installed `accelerate`, called directly: `infer_auto_device_map`,
`get_balanced_memory`, `compute_module_sizes`, `get_max_layer_size`, `calculate_maximum_sizes`,
`dtype_byte_size`. Budgets name accelerators this machine lacks; both libraries plan for them
from `max_memory` alone (no device is touched), so no device count is faked.
"""

from __future__ import annotations

import logging
import random
import warnings
from collections.abc import Callable
from typing import Any

import accelerate.utils.modeling as theirs
import pytest
import torch
from torch import nn

import accelerando.utils.modeling as ours
from accelerando.big_model.device_map import device_for
from accelerando.big_model.init import init_empty_weights


class TwoLayer(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, 2 * dim)
        self.fc2 = nn.Linear(2 * dim, dim)


class Net(nn.Module):
    """Embedding, a ModuleList of 2-layer blocks, LayerNorm, a head (optionally tied), a top-level buffer."""

    def __init__(self, layers: int = 4, tie: bool = False, buffer: bool = True) -> None:
        super().__init__()
        self.embed = nn.Embedding(32, 8)
        self.blocks = nn.ModuleList(TwoLayer(8) for _ in range(layers))
        self.norm = nn.LayerNorm(8)
        self.head = nn.Linear(8, 32, bias=False)
        if tie:
            self.head.weight = self.embed.weight
        if buffer:
            self.register_buffer("pos", torch.zeros(100))


class Normed(nn.Module):
    """Own parameter first, BatchNorm (int64 and float buffers), a bool buffer (1/8 byte per element)."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(40))
        self.body = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 16))
        self.norm = nn.BatchNorm1d(16)
        self.out = nn.Linear(16, 4)
        self.register_buffer("mask", torch.ones(13, dtype=torch.bool))


class DeepTie(nn.Module):
    """A tie reaching into a nested container: the embedding must pull (a piece of) `decoder` along."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(24, 8)
        self.mid = nn.Sequential(nn.Linear(8, 32), nn.Linear(32, 8))
        self.decoder = nn.Sequential(nn.Linear(8, 64), nn.Linear(64, 8), nn.Linear(8, 24, bias=False))
        self.decoder[2].weight = self.embed.weight
        self.register_buffer("step", torch.zeros((), dtype=torch.int64))


class ThreeTie(nn.Module):
    """One weight under three names (two of them in the same later module)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(12, 12, bias=False)
        self.b = nn.Linear(12, 40)
        self.c = nn.Module()
        self.c.x = nn.Linear(12, 12, bias=False)
        self.c.y = nn.Linear(12, 12, bias=False)
        self.c.z = nn.Linear(12, 30)
        self.c.x.weight = self.a.weight
        self.c.y.weight = self.a.weight


def wide() -> nn.Module:
    """Top-level layers of very different sizes (names "0", "1", ...): fallback allocation has work."""
    return nn.Sequential(
        nn.Linear(4, 8), nn.Linear(8, 96), nn.Linear(96, 4), nn.Linear(4, 4), nn.Linear(4, 2)
    )


MODELS: dict[str, tuple[Callable[[], nn.Module], list[str]]] = {
    "net": (lambda: Net(), ["TwoLayer"]),
    "net_tied": (lambda: Net(tie=True), ["TwoLayer"]),
    "net_tied_nobuf": (lambda: Net(layers=6, tie=True, buffer=False), ["TwoLayer"]),
    "normed": (Normed, ["Sequential"]),
    "deep_tie": (DeepTie, ["Sequential"]),
    "three_tie": (ThreeTie, ["Linear"]),
    "wide": (wide, ["Linear"]),
}
DEVICE_SETS: list[tuple[Any, ...]] = [
    (0, 1, "cpu"),
    (0, "cpu"),
    ("cpu",),
    (0, 1, "cpu", "disk"),
    (0, 1, 2, "cpu"),
    ("mps", "cpu"),
    (1, 0),
]
FRACTIONS = [0, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.7, 1.0, 1.3]


def meta_model(name: str) -> nn.Module:
    with init_empty_weights():
        return MODELS[name][0]()


def budgets(model: nn.Module, rng: random.Random, count: int) -> list[dict[Any, int]]:
    """`count` budgets: each device gets a fraction of the model's size (the disk budget is ignored)."""
    total = ours.compute_module_sizes(model)[""]
    chosen = []
    for _ in range(count):
        devices = rng.choice(DEVICE_SETS)
        chosen.append({d: int(total * rng.choice(FRACTIONS)) for d in devices})
    return chosen


def run(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, list[str]]:
    """Result (or the exception's type name) and the first sentence of each warning raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result: Any = dict(fn(*args, **kwargs))
        except Exception as error:  # Accelerate crashes on some inputs; recorded, compared below
            result = type(error).__name__
    return result, [str(w.message).split(". ")[0] for w in caught]


def special_dtypes(model: nn.Module, rng: random.Random) -> dict[str, Any] | None:
    """None, or one or two of the model's parameters loaded in another dtype (int8, float16, bool)."""
    if rng.random() < 0.6:
        return None
    names = [n for n, _ in model.named_parameters()]
    picked = rng.sample(names, min(2, len(names)))
    return {n: rng.choice([torch.int8, torch.float16, "torch.bool"]) for n in picked}


def case_rows(seed: int, per_model: int) -> list[tuple[str, dict[Any, Any], dict[str, Any]]]:
    """Per model: budgets over several device sets, and a random choice of every planning option."""
    rng = random.Random(seed)
    rows = []
    for name, (_, no_split) in MODELS.items():
        model = meta_model(name)
        for budget in budgets(model, rng, per_model):
            options = {
                "no_split_module_classes": no_split if rng.random() < 0.5 else None,
                "fallback_allocation": rng.random() < 0.5,
                "offload_buffers": rng.random() < 0.3,
                "clean_result": rng.random() < 0.7,
                "dtype": rng.choice([None, None, torch.float16, "bfloat16"]),
                "special_dtypes": special_dtypes(model, rng),
            }
            rows.append((name, budget, options))
    return rows


@pytest.fixture(autouse=True)
def _quiet_device_checks() -> Any:
    """Both libraries log that the budget's accelerators are absent here: true, and not the point."""
    loggers = [logging.getLogger("accelerate.utils.modeling"), logging.getLogger("accelerando.big_model")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    yield
    for lg, level in zip(loggers, levels):
        lg.setLevel(level)


ROWS = case_rows(seed=19, per_model=70)


@pytest.mark.parametrize("model_name", list(MODELS))
def test_infer_auto_device_map_equals_accelerate(model_name: str) -> None:
    model = meta_model(model_name)
    rows = [(budget, options) for name, budget, options in ROWS if name == model_name]
    mismatches, crashes = [], 0
    for budget, options in rows:
        expected, their_warnings = run(theirs.infer_auto_device_map, model, dict(budget), **options)
        if isinstance(expected, str):
            crashes += 1
            continue
        got, our_warnings = run(ours.infer_auto_device_map, model, dict(budget), **options)
        if got != expected or our_warnings != their_warnings:
            mismatches.append((budget, options, expected, got, their_warnings, our_warnings))
    assert not mismatches, f"{len(mismatches)}/{len(rows)} differ; first: {mismatches[0]}"
    assert crashes <= len(rows) // 10


STRING_BUDGETS: list[dict[Any, Any]] = [
    {0: "1KB", 1: "2KiB", "cpu": "5KB"},
    {0: "0.5KB", "cpu": "3KiB", "disk": "1KB"},
    {"cpu": "4KB"},
]


@pytest.mark.parametrize("budget", STRING_BUDGETS)
def test_string_budgets_equal_accelerate(budget: dict[Any, Any]) -> None:
    for name in MODELS:
        model = meta_model(name)
        assert run(ours.infer_auto_device_map, model, dict(budget)) == run(
            theirs.infer_auto_device_map, model, dict(budget)
        ), name


def transformers_models() -> dict[str, nn.Module]:
    """Tiny Llama (tied and not), GPT-2 and T5 (a four-way tie) on meta, weights tied as loaded."""
    transformers = pytest.importorskip("transformers")

    def llama(tie: bool) -> Any:
        return transformers.LlamaConfig(
            vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=tie,
        )  # fmt: skip

    configs = {
        "llama_tied": (transformers.LlamaForCausalLM, llama(True)),
        "llama": (transformers.LlamaForCausalLM, llama(False)),
        "gpt2": (
            transformers.GPT2LMHeadModel,
            transformers.GPT2Config(vocab_size=96, n_embd=32, n_layer=4, n_head=4),
        ),
        "t5": (
            transformers.T5ForConditionalGeneration,
            transformers.T5Config(vocab_size=96, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4),
        ),
    }
    models = {}
    for name, (cls, config) in configs.items():
        with init_empty_weights():
            models[name] = cls(config)
        models[name].tie_weights()
    return models


def test_transformers_models_are_planned_like_accelerate() -> None:
    rng = random.Random(7)
    for name, model in transformers_models().items():
        no_split = list(model._no_split_modules)
        for budget in budgets(model, rng, 40):
            options = {
                "no_split_module_classes": no_split if rng.random() < 0.7 else None,
                "fallback_allocation": rng.random() < 0.5,
                "offload_buffers": rng.random() < 0.3,
                "dtype": rng.choice([None, "float16"]),
            }
            expected = run(theirs.infer_auto_device_map, model, dict(budget), **options)
            assert run(ours.infer_auto_device_map, model, dict(budget), **options) == expected, (name, budget)
        assert ours.compute_module_sizes(model) == theirs.compute_module_sizes(model)
        assert ours.calculate_maximum_sizes(model) == theirs.calculate_maximum_sizes(model)


BALANCED_SETS: list[tuple[Any, ...]] = [
    (0, 1, "cpu"),
    (0, 1, 2, "cpu"),
    (0, "cpu"),
    (1, 2),
    (0, 1, 2, 3),
    ("mps", "cpu"),
]


@pytest.mark.parametrize("model_name", list(MODELS))
def test_balanced_memory_and_auto_maps_equal_accelerate(model_name: str) -> None:
    """`get_balanced_memory` (what "auto"/"balanced"/"balanced_low_0" plan with), then the map from it."""
    model = meta_model(model_name)
    total = ours.compute_module_sizes(model)[""]
    rng = random.Random(model_name)
    for devices in BALANCED_SETS:
        for _ in range(6):
            budget = {d: int(total * rng.choice([0, 0.1, 0.3, 0.6, 1.0, 2.0])) for d in devices}
            options = {
                "no_split_module_classes": MODELS[model_name][1] if rng.random() < 0.5 else None,
                "dtype": rng.choice([None, torch.float16]),
                "low_zero": rng.random() < 0.4,
            }
            expected = run(theirs.get_balanced_memory, model, dict(budget), **options)
            got = run(ours.get_balanced_memory, model, dict(budget), **options)
            if expected[0] == "KeyError":  # Accelerate's low_zero reads device 0 even when it is not given
                assert options["low_zero"] and 0 not in budget and isinstance(got[0], dict)
                continue
            assert got == expected, (budget, options)
            plan_options = {k: v for k, v in options.items() if k != "low_zero"}
            assert run(ours.infer_auto_device_map, model, got[0], **plan_options) == run(
                theirs.infer_auto_device_map, model, expected[0], **plan_options
            ), (budget, options)


@pytest.mark.parametrize("model_name", list(MODELS))
def test_sizes_and_largest_layer_equal_accelerate(model_name: str) -> None:
    model = meta_model(model_name)
    no_split = MODELS[model_name][1]
    specials = [None, {n: torch.int8 for n, _ in list(model.named_parameters())[:2]}]
    for dtype in (None, torch.float16, "bfloat16", torch.float64):
        for special in specials:
            mine = ours.compute_module_sizes(model, dtype=dtype, special_dtypes=special)
            assert mine == theirs.compute_module_sizes(model, dtype=dtype, special_dtypes=special)
            assert ours.compute_module_sizes(
                model, dtype, special, buffers_only=True
            ) == theirs.compute_module_sizes(model, dtype, special, buffers_only=True)
            assert ours.compute_module_total_buffer_size(model, dtype, special) == (
                theirs.compute_module_total_buffer_size(model, dtype, special)
            )
            assert ours.get_module_leaves(mine) == theirs.get_module_leaves(mine)
            entries = [
                list(model.named_children()),
                list(model.named_parameters(recurse=False)) + list(model.named_children()) + list(model.named_buffers(recurse=False)),
                list(model.named_modules())[1:],
            ]  # fmt: skip
            for modules in entries:
                for classes in ([], no_split, ["Embedding", *no_split]):
                    assert ours.get_max_layer_size(modules, mine, classes) == theirs.get_max_layer_size(
                        modules, mine, classes
                    )
    assert ours.calculate_maximum_sizes(model) == theirs.calculate_maximum_sizes(model)


def test_dtype_byte_size_equals_accelerate_including_custom_dtypes() -> None:
    from accelerate.utils import CustomDtype

    dtypes = [getattr(torch, n) for n in dir(torch) if isinstance(getattr(torch, n), torch.dtype)]
    for dtype in [*dtypes, *CustomDtype]:
        mine, reference = ours.dtype_byte_size(dtype), theirs.dtype_byte_size(dtype)
        assert mine == reference and type(mine) is type(reference), dtype
    for custom in ours.CustomDtype:
        assert ours.dtype_byte_size(custom) == theirs.dtype_byte_size(CustomDtype(custom.value))


# ---- deliberate differences (docs/migration.md): each shows where Accelerate's own result breaks ----


class Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)
        self.register_buffer("running", torch.zeros(10))


class Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.x = Inner()
        self.y = Inner()


def test_split_module_own_buffers_get_a_device() -> None:
    """Accelerate drops a split module's own buffers from the map, which its own check then rejects."""
    model = Outer()
    budget = {0: 400, "cpu": 5000}
    reference = dict(theirs.infer_auto_device_map(model, budget, clean_result=False))
    assert "x.running" not in reference
    with pytest.raises(ValueError, match="x.running"):
        theirs.check_device_map(model, reference)
    mine = ours.infer_auto_device_map(model, budget, clean_result=False)
    assert mine == {**reference, "x.running": "cpu"}
    ours.check_device_map(model, mine)


@pytest.mark.parametrize(
    ("model_name", "budget", "options"),
    [
        # a tied partner already taken out of the search list: Accelerate raises IndexError
        ("deep_tie", {0: 7368, 1: 2947, "cpu": 7368}, {"no_split_module_classes": ["Sequential"]}),
        ("net_tied_nobuf", {0: 1171, 1: 2342, "cpu": 3123}, {"no_split_module_classes": ["TwoLayer"]}),
        # room of a fraction of a byte (bool tensors) for the fallback: Accelerate raises AttributeError
        ("normed", {0: 5505, "cpu": 0}, {}),
    ],
)
def test_fallback_allocation_plans_where_accelerate_raises(
    model_name: str, budget: dict[Any, int], options: dict[str, Any]
) -> None:
    model = meta_model(model_name)
    with pytest.raises((IndexError, AttributeError)):
        theirs.infer_auto_device_map(model, dict(budget), fallback_allocation=True, **options)
    mine = ours.infer_auto_device_map(model, dict(budget), fallback_allocation=True, **options)
    ours.check_device_map(model, mine)
    for group in ours.find_tied_parameters(model):
        assert len({str(device_for(n, mine)) for n in group}) == 1
    # without the fallback both agree
    assert run(ours.infer_auto_device_map, model, dict(budget), **options) == run(
        theirs.infer_auto_device_map, model, dict(budget), **options
    )


def test_balanced_memory_with_a_disk_budget() -> None:
    """Accelerate's `get_balanced_memory` raises on a "disk" key; here the disk budget passes through."""
    model = meta_model("net")
    budget = {0: 3000, 1: 3000, "cpu": 3000, "disk": 10**6}
    with pytest.raises(RuntimeError):
        theirs.get_balanced_memory(model, dict(budget))
    without_disk = {k: v for k, v in budget.items() if k != "disk"}
    assert ours.get_balanced_memory(model, budget) == {
        **theirs.get_balanced_memory(model, without_disk),
        "disk": 10**6,
    }
