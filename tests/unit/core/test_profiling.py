"""`Accelerator.profile()` and `ProfileKwargs` on torch.profiler: traces that name the model's ops."""

from __future__ import annotations

import json

import pytest
import torch

from accelerando import Accelerator, ProfileKwargs


def model_and_input():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)), torch.randn(
        4, 8
    )


def test_chrome_trace_names_the_models_ops(tmp_path):
    acc = Accelerator(cpu=True, kwargs_handlers=[ProfileKwargs(output_trace_dir=str(tmp_path / "traces"))])
    model, x = model_and_input()
    model = acc.prepare(model)
    with acc.profile() as prof:
        model(x).sum().backward()
    names = {
        e.get("name") for e in json.loads((tmp_path / "traces" / "profile_0.json").read_text())["traceEvents"]
    }
    assert {"aten::linear", "aten::relu", "aten::addmm"} <= names
    assert any(e.key == "aten::linear" and e.count == 2 for e in prof.key_averages())
    assert not list((tmp_path / "traces").glob("*.tmp*"))  # written under a temporary name, then renamed


def test_schedule_shapes_and_build():
    seen = []
    handler = ProfileKwargs(
        activities=["cpu"],
        schedule_option={"wait": 1, "warmup": 1, "active": 2, "repeat": 1},
        on_trace_ready=lambda p: seen.append(p.key_averages(group_by_input_shape=True)),
        record_shapes=True,
    )
    assert isinstance(handler.build(), torch.profiler.profile)
    acc = Accelerator(cpu=True)
    model, x = model_and_input()
    with acc.profile(handler) as prof:
        for _ in range(5):
            model(x)
            prof.step()
    assert len(seen) == 1  # one cycle recorded, two active steps
    linear = {tuple(map(tuple, e.input_shapes[:1])): e.count for e in seen[0] if e.key == "aten::linear"}
    assert linear == {((4, 8),): 2, ((4, 16),): 2}  # shapes recorded; 2 active steps x 1 call each


def test_bad_activity_is_named():
    with pytest.raises(ValueError, match="profiler activity 'gpu' is not supported; accepted: cpu, cuda"):
        ProfileKwargs(activities=["gpu"]).build()
