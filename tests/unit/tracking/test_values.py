"""Config and log values become what every SDK accepts (dtypes, paths, enums, dataclasses)."""

from __future__ import annotations

import dataclasses
import enum
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from accelerando.tracking.values import flatten, log_values, plain


class Color(enum.Enum):
    RED = "red"


@dataclasses.dataclass
class Inner:
    dtype: torch.dtype = torch.bfloat16
    where: Path = Path("/data/x")


@dataclasses.dataclass
class Outer:
    inner: Inner = dataclasses.field(default_factory=Inner)
    tags: tuple = ("a", "b")
    seen: frozenset = frozenset({2, 1})


CONFIG = {
    "lr": 1e-3,
    "dtype": torch.float16,
    "device": torch.device("cpu"),
    "path": Path("/tmp/run"),
    "color": Color.RED,
    "cfg": Outer(),
    "scalar": torch.tensor(2.5),
    "np": np.int64(7),
    "none": None,
    "obj": object,
}


def test_plain_is_json_and_keeps_structure():
    out = plain(CONFIG)
    json.dumps(out)  # serialisable, no default= needed
    assert out["dtype"] == "torch.float16"
    assert out["device"] == "cpu"
    assert out["path"] == "/tmp/run"
    assert out["color"] == "red"
    assert out["cfg"] == {
        "inner": {"dtype": "torch.bfloat16", "where": "/data/x"},
        "tags": ["a", "b"],
        "seen": [1, 2],
    }
    assert out["scalar"] == 2.5 and out["np"] == 7 and isinstance(out["np"], int)
    assert out["none"] is None
    assert out["obj"] == "<class 'object'>"


def test_flatten_gives_one_level_of_scalars():
    flat = flatten(CONFIG)
    assert flat["cfg/inner/dtype"] == "torch.bfloat16"
    assert flat["cfg/tags"] == "['a', 'b']"
    assert flat["none"] == "None"
    assert flat["lr"] == 1e-3
    assert all(isinstance(v, (bool, int, float, str)) for v in flat.values())
    assert flatten({"a": {}}) == {"a": "{}"}


def test_log_values_turns_single_numbers_into_python_numbers():
    values = log_values({"loss": torch.tensor([0.5]), "n": np.float32(1.5), "t": "x", "v": torch.ones(3)})
    assert values["loss"] == 0.5 and type(values["loss"]) is float
    assert type(values["n"]) is float
    assert values["t"] == "x" and values["v"].shape == (3,)  # left for the SDK (histograms, media)
    with pytest.raises(TypeError, match="dict of name -> value"):
        log_values([("loss", 1.0)])
    with pytest.raises(TypeError, match="keys must be strings"):
        log_values({1: 1.0})
