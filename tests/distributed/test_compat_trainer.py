"""transformers' Trainer and peft LoRA on accelerando through the switch (issue 19's proof).

One 2-rank launch and one plain process, started together; `scripts/compat_trainer.py` says what
each runs. Every optimizer step sees the same 8 samples in both, so the loss curves and final
weights agree; resumed runs start from other random weights, so only a working resume reaches
the uninterrupted run's weights.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from accelerando.config import env
from accelerando.testing import run_distributed

pytestmark = pytest.mark.skipif(
    not all(importlib.util.find_spec(name) for name in ("transformers", "peft")),
    reason="needs transformers and peft (the test extra)",
)

SCRIPT = Path(__file__).parent / "scripts" / "compat_trainer.py"
ACCELERATOR = "accelerando.accelerator"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    out = tmp_path_factory.mktemp("trainer")
    child = {k: v for k, v in env.snapshot().items() if not k.startswith((env.PREFIX, env.ALIAS_PREFIX))}
    child["OMP_NUM_THREADS"] = "1"
    reference = subprocess.Popen(
        [sys.executable, str(SCRIPT), str(out), "reference"],
        env=child,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        run_distributed(SCRIPT, [str(out), "ranks"], timeout=240)
        log, _ = reference.communicate(timeout=240)
    finally:
        if reference.poll() is None:
            reference.kill()
            reference.communicate()
    assert reference.returncode == 0, log[-6000:]
    return out, json.loads((out / "reference.json").read_text()), json.loads((out / "ranks.json").read_text())


def _weights(out: Path, name: str) -> dict[str, torch.Tensor]:
    return torch.load(out / name, weights_only=True)


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.mark.parametrize("run", ["full", "lora"])
def test_two_ranks_with_accumulation_equal_one_process_with_double_batch(runs: Any, run: str) -> None:
    out, reference, ranks = runs
    assert reference[run]["accelerator"] == ranks[run]["accelerator"] == ACCELERATOR
    assert ranks[run]["steps_run"] == reference[run]["steps_run"] == 4
    assert ranks[run]["losses"] == pytest.approx(reference[run]["losses"], rel=1e-5)
    diff = _max_diff(_weights(out, f"ranks_{run}.pt"), _weights(out, f"reference_{run}.pt"))
    assert diff < 1e-5, diff


def test_training_moved_the_weights(runs: Any) -> None:
    assert runs[2]["learned"] > 1e-3  # so equal end weights below are not equal start weights


@pytest.mark.parametrize(
    ("run", "diff"),
    [
        ("resumed", "resume_max_diff"),
        ("lora_resumed", "lora_resume_max_diff"),
        ("fsdp_resumed", "fsdp_resume_max_diff"),
    ],
)
def test_resume_from_checkpoint_reaches_the_uninterrupted_weights(runs: Any, run: str, diff: str) -> None:
    ranks = runs[2]
    assert ranks[run]["accelerator"] == ACCELERATOR
    assert ranks[run]["steps_run"] == 2  # steps 3 and 4 only: the checkpoint was at step 2
    assert ranks[diff] < 1e-6, ranks[diff]


def test_saved_model_and_adapter_load_with_from_pretrained(runs: Any) -> None:
    ranks = runs[2]
    assert ranks["from_pretrained_max_diff"] == 0.0
    assert ranks["lora_from_pretrained_max_diff"] == 0.0
    assert "adapter_model.safetensors" in ranks["lora_files"]
    assert "model.safetensors" not in ranks["lora_files"]  # the adapter only


def test_fsdp_trainer_checkpoints_through_the_fsdp_helpers(runs: Any) -> None:
    ranks = runs[2]
    assert ranks["fsdp_is_fsdp"] and ranks["fsdp"]["accelerator"] == ACCELERATOR
    assert ranks["fsdp_vs_ddp_max_diff"] < 1e-5
    assert {"pytorch_model_fsdp.bin", "optimizer.bin"} <= set(ranks["fsdp_checkpoint_files"])
    assert ranks["helpers_dcp1"]["files"] == ["optimizer_0", "pytorch_model_fsdp_0"]
    assert ranks["helpers_dcp0"]["files"] == [
        "optimizer_0_rank0.bin",
        "optimizer_0_rank1.bin",
        "pytorch_model_fsdp_0_rank0.bin",
        "pytorch_model_fsdp_0_rank1.bin",
    ]
    for key in ("helpers_dcp1", "helpers_dcp0"):
        assert ranks[key]["model_max_diff"] == 0.0 and ranks[key]["optimizer_equal"], ranks[key]
