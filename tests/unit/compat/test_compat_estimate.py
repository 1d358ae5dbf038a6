"""`commands.estimate`'s helper names against Accelerate's own (pure: outputs compared directly)."""

from __future__ import annotations

import pytest
import torch

from accelerando.commands import estimate as ours

theirs = pytest.importorskip("accelerate.commands.estimate")

TABLES = [
    (
        ["dtype", "Largest Layer", "Total Size"],
        [["float32", "1.2 MB", "30 MB"], ["int4", "3 KB", "1 GB"]],
        "t",
    ),
    (["a", "b"], [["1", "22"]], "a title wider than every column together"),
    (["a", "b"], [["1", "2"]], "abcd"),  # just wider than the columns, narrower than the rule
    (["x"], [["long cell value"], [""]], "Memory Usage for loading `model`"),
]


@pytest.mark.parametrize(("headers", "rows", "title"), TABLES)
def test_create_ascii_table_draws_accelerates_table(headers, rows, title) -> None:
    assert ours.create_ascii_table(headers, rows, title) == theirs.create_ascii_table(headers, rows, title)


def test_create_empty_model_builds_on_meta_from_a_local_spec(tmp_path, monkeypatch) -> None:
    (tmp_path / "tiny_factory.py").write_text("import torch\ndef make():\n    return torch.nn.Linear(3, 2)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    model = ours.create_empty_model("tiny_factory:make", library_name=None)
    assert model.weight.device == torch.device("meta") and model.weight.shape == (2, 3)
    with pytest.raises(ValueError, match="library_name='keras': accepted are"):
        ours.create_empty_model("tiny_factory:make", library_name="keras")
