"""A save that dies half-way (an exception, or SIGKILL) never costs the previous checkpoint."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import pytest
import torch

from accelerando.checkpoint.atomic import CheckpointError, validate_checkpoint
from accelerando.checkpoint.naming import latest_checkpoint, list_checkpoints
from accelerando.testing import run_distributed

SCRIPT = Path(__file__).parent / "scripts" / "ckpt_failures.py"


def _script_module():
    spec = importlib.util.spec_from_file_location("ckpt_failures", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_exception_mid_save_keeps_previous(tmp_path: Path) -> None:
    proc = run_distributed(SCRIPT, ["raise", str(tmp_path)], timeout=120)
    assert "FAILURES raise ok" in proc.stdout


def test_sigkill_mid_save_keeps_previous(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    run_distributed(SCRIPT, ["kill", str(tmp_path)], timeout=120, expect_success=False)
    root = tmp_path / "proj" / "checkpoints"
    assert [i for i, _ in list_checkpoints(root)] == [0]
    half = root / ".checkpoint_1.incomplete"
    assert (half / "model.safetensors").is_file()  # it really died mid-save
    with pytest.raises(CheckpointError, match="incomplete"):
        validate_checkpoint(half)
    good = latest_checkpoint(root)
    assert good == root / "checkpoint_0"
    validate_checkpoint(good)
    acc, model, _ = _script_module().build(tmp_path / "proj")  # one process loads what two saved
    with caplog.at_level(logging.WARNING, logger="accelerando.checkpoint.manager"):
        assert acc.load_state() == str(good)  # no path: the newest complete one, the partial is dropped
    assert not half.exists(), "the partial checkpoint of the killed save was not removed"
    assert any(".checkpoint_1.incomplete" in r.getMessage() and "did not finish" in r.getMessage()
               for r in caplog.records), caplog.text  # fmt: skip
    want = torch.load(tmp_path / "good_weights.pt", weights_only=True)
    assert all(torch.equal(a, b) for a, b in zip(want, model.parameters()))
    assert acc.project_configuration.iteration == 1
