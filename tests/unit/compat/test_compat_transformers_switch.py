"""transformers through `accelerando.as_accelerate()`: TrainingArguments, then Trainer and
Seq2SeqTrainer on a tiny Llama, in one process (2 ranks: tests/distributed/test_accelerate_dropin.py).

One fresh interpreter runs every step and reports what happened as JSON, so a failure names the
`accelerate.*` import or call that is missing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from accelerando.config import env

SCRIPT = textwrap.dedent(
    """
    import importlib.util, json, re, sys, traceback
    import accelerando
    accelerando.as_accelerate()
    import torch
    report = {}

    def attempt(step, fn):
        try:
            report[step] = {"ok": True, "value": fn()}
            return True
        except Exception as err:
            text = f"{type(err).__name__}: {err}"
            report[step] = {"ok": False, "error": text, "trace": traceback.format_exc()[-3000:]}
            return False

    def training_arguments():
        from transformers import TrainingArguments
        from transformers.utils import is_accelerate_available
        args = TrainingArguments(output_dir=sys.argv[1], use_cpu=True, report_to=[])
        return {"available": is_accelerate_available(), "device": str(args.device)}

    def train():
        from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments
        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
        model = LlamaForCausalLM(config)
        ids = torch.randint(0, 64, (16, 16), generator=torch.Generator().manual_seed(1))
        data = [{"input_ids": row, "labels": row} for row in ids]
        args = TrainingArguments(output_dir=sys.argv[1], use_cpu=True, per_device_train_batch_size=4, max_steps=3,
                                 gradient_accumulation_steps=2, logging_steps=1, report_to=[], save_strategy="no")
        trainer = Trainer(model=model, args=args, train_dataset=data)
        trainer.train()
        losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
        trainer.save_model(sys.argv[1] + "/final")
        LlamaForCausalLM.from_pretrained(sys.argv[1] + "/final")
        return {"accelerator": type(trainer.accelerator).__module__, "losses": losses}

    def seq2seq():
        from transformers import LlamaConfig, LlamaForCausalLM, Seq2SeqTrainer, Seq2SeqTrainingArguments
        config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                             num_attention_heads=2, num_key_value_heads=1)
        ids = torch.randint(0, 64, (8, 8), generator=torch.Generator().manual_seed(2))
        args = Seq2SeqTrainingArguments(output_dir=sys.argv[1] + "/s2s", use_cpu=True, per_device_train_batch_size=4,
                                        max_steps=2, report_to=[], save_strategy="no", disable_tqdm=True)
        trainer = Seq2SeqTrainer(model=LlamaForCausalLM(config), args=args,
                                 train_dataset=[{"input_ids": r, "labels": r} for r in ids])
        trainer.train()
        return {"accelerator": type(trainer.accelerator).__module__, "steps": trainer.state.global_step}

    if attempt("training_arguments", training_arguments):
        attempt("trainer", train)
        attempt("seq2seq", seq2seq)
    print("REPORT " + json.dumps(report))
    """
)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder: Path = tmp_path_factory.mktemp("trainer")
    child = {k: v for k, v in env.snapshot().items() if not k.startswith((env.PREFIX, env.ALIAS_PREFIX))}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(folder)], env=child, capture_output=True, text=True, timeout=600
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("REPORT ")]
    assert proc.returncode == 0 and lines, (
        f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"
    )
    return json.loads(lines[-1].removeprefix("REPORT "))


def test_training_arguments_work_through_the_switch(report: dict[str, Any]) -> None:
    step = report["training_arguments"]
    assert step["ok"], step.get("trace")
    assert step["value"] == {"available": True, "device": "cpu"}


def test_trainer_trains_through_the_switch(report: dict[str, Any]) -> None:
    step = report["trainer"]
    assert step["ok"], step["error"]
    value = step["value"]
    assert value["accelerator"] == "accelerando.accelerator"
    assert len(value["losses"]) == 3 and all(loss == loss and loss < 10 for loss in value["losses"])


def test_seq2seq_trainer_trains_through_the_switch(report: dict[str, Any]) -> None:
    step = report["seq2seq"]
    assert step["ok"], step.get("trace")
    assert step["value"] == {"accelerator": "accelerando.accelerator", "steps": 2}
