"""transformers' Trainer (and peft LoRA) on accelerando through `accelerando.as_accelerate()`.

Run by tests/distributed/test_accelerate_dropin.py in two ways, on the same tiny random-init Llama
and the same 32 token rows:
- `reference`: one plain process, per-device batch 4, accumulation 2 (8 samples per step);
- `ranks`: 2 gloo ranks (after Accelerate's scripts, in the same launch), per-device batch 2,
  accumulation 2 (8 samples per step): an uninterrupted run that checkpoints every 2 steps, a fresh
  Trainer resumed from its step-2 checkpoint, `save_model` + `from_pretrained`, the same three with
  a LoRA adapter (plus its `adapter_only` save/load through the FSDP helpers), and FSDP
  (FULL_STATE_DICT checkpoints through `save_fsdp_model` & co.) with the helpers' SHARDED and
  per-rank paths round-tripped directly.
Rank 0 writes `<mode>.json` (losses per step, checks' numbers, seconds) and `<mode>_<run>.pt`
(final weights) into the folder it is given; the test compares the two modes.
"""

import json
import sys
import time
from pathlib import Path

import accelerando

accelerando.as_accelerate()

import torch  # noqa: E402
from transformers import (  # noqa: E402
    LlamaConfig,
    LlamaForCausalLM,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

STARTED = time.perf_counter()
OUT = Path(sys.argv[1])
MODE = sys.argv[2]
STEPS, ACCUMULATION = 4, 2
BATCH = 4 if MODE == "reference" else 2
CONFIG = LlamaConfig(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=32,
)
ROWS = torch.randint(0, 64, (32, 16), generator=torch.Generator().manual_seed(1))
DATA = [{"input_ids": row, "labels": row} for row in ROWS]
report: dict = {}


def fresh_model(seed: int = 0) -> torch.nn.Module:
    """A resumed run starts from other weights: only a working resume can reach the same end."""
    torch.manual_seed(seed)
    return LlamaForCausalLM(CONFIG)


def lora(model: torch.nn.Module, seed: int = 1) -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    return get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))


class StepCounter(TrainerCallback):
    """Optimizer steps this Trainer ran (a resumed run logs the restored history too)."""

    steps = 0

    def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        self.steps += 1


def train(name: str, model: torch.nn.Module, resume: str | None = None, **extra) -> Trainer:
    args = TrainingArguments(
        output_dir=str(OUT / name),
        use_cpu=True,
        per_device_train_batch_size=BATCH,
        gradient_accumulation_steps=ACCUMULATION,
        max_steps=STEPS,
        learning_rate=1e-2,
        logging_steps=1,
        save_strategy="steps",
        save_steps=2,
        report_to=[],
        disable_tqdm=True,
        seed=0,
        **extra,
    )
    start = time.perf_counter()
    counter = StepCounter()
    trainer = Trainer(model=model, args=args, train_dataset=DATA, callbacks=[counter])
    trainer.train(resume_from_checkpoint=resume)
    report[name] = {
        "losses": [e["loss"] for e in trainer.state.log_history if "loss" in e],
        "accelerator": type(trainer.accelerator).__module__,
        "steps_run": counter.steps,
        "seconds": round(time.perf_counter() - start, 2),
    }
    return trainer


def weights(trainer: Trainer, trainable_only: bool = False) -> dict[str, torch.Tensor]:
    """The full weights (gathered under FSDP: a collective, every rank calls it)."""
    state = trainer.accelerator.get_state_dict(trainer.model)
    if trainable_only:
        names = {
            n
            for n, p in trainer.accelerator.unwrap_model(trainer.model).named_parameters()
            if p.requires_grad
        }
        state = {k: v for k, v in state.items() if k in names}
    return {k: v.detach().float().cpu().clone() for k, v in state.items()}


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Largest difference of two full state dicts (FSDP gathers them onto rank 0 only: -1 elsewhere)."""
    if not main_process():
        return -1.0
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))[:6]
    return max((a[k] - b[k]).abs().max().item() for k in a)


def main_process() -> bool:
    return not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0


def save_weights(name: str, state: dict[str, torch.Tensor]) -> None:
    if main_process():
        torch.save(state, OUT / f"{MODE}_{name}.pt")


# ---- plain: the loss curve, then resume and from_pretrained (2 ranks) ---------------------------
initial = {k: v.clone() for k, v in fresh_model().state_dict().items()}
full = train("full", fresh_model())
full_weights = weights(full)
save_weights("full", full_weights)
report["learned"] = max_diff(full_weights, initial)
lora_trainer = train("lora", lora(fresh_model()))
lora_weights = weights(lora_trainer, trainable_only=True)
save_weights("lora", lora_weights)

if MODE == "ranks":
    from peft import PeftModel

    rank = torch.distributed.get_rank()
    resumed = train("resumed", fresh_model(seed=5), resume=str(OUT / "full" / "checkpoint-2"))
    report["resume_max_diff"] = max_diff(weights(resumed), full_weights)
    full.save_model(str(OUT / "full" / "final"))
    if rank == 0:
        loaded = LlamaForCausalLM.from_pretrained(str(OUT / "full" / "final"))
        report["from_pretrained_max_diff"] = max_diff(
            {k: v.float() for k, v in loaded.state_dict().items()}, full_weights
        )

    lora_resumed = train(
        "lora_resumed", lora(fresh_model(), seed=5), resume=str(OUT / "lora" / "checkpoint-2")
    )
    report["lora_resume_max_diff"] = max_diff(weights(lora_resumed, trainable_only=True), lora_weights)
    lora_trainer.save_model(str(OUT / "lora" / "final"))
    if rank == 0:
        adapter = PeftModel.from_pretrained(fresh_model(), str(OUT / "lora" / "final"))
        got = {k: v.float() for k, v in adapter.state_dict().items() if k in lora_weights}
        report["lora_from_pretrained_max_diff"] = max_diff(got, lora_weights)
        report["lora_files"] = sorted(p.name for p in (OUT / "lora" / "final").iterdir())

    # ---- adapter_only through the FSDP helpers (on the DDP LoRA model: they work on any strategy) --
    from accelerate import FullyShardedDataParallelPlugin
    from accelerate.utils import load_fsdp_model, save_fsdp_model

    full_plugin = FullyShardedDataParallelPlugin(state_dict_type="FULL_STATE_DICT")
    acc, peft_model = lora_trainer.accelerator, lora_trainer.model
    save_fsdp_model(full_plugin, acc, peft_model, OUT / "adapter", adapter_only=True)
    with torch.no_grad():
        for p in peft_model.parameters():
            if p.requires_grad:
                p.zero_()
    result = load_fsdp_model(full_plugin, acc, peft_model, OUT / "adapter", adapter_only=True)
    saved = torch.load(OUT / "adapter" / "pytorch_model_fsdp.bin", weights_only=True)
    report["adapter_only"] = {
        "keys": len(saved),
        "all_lora": all("lora_" in k for k in saved),
        "unexpected": list(result.unexpected_keys),
        "max_diff": max_diff(weights(lora_trainer, trainable_only=True), lora_weights),
    }

    # ---- FSDP through the Trainer: FULL_STATE_DICT checkpoints via save_fsdp_model & co. ---------
    fsdp = {"fsdp": "full_shard", "fsdp_config": {"version": 2}}
    fsdp_full = train("fsdp", fresh_model(), **fsdp)
    fsdp_weights = weights(fsdp_full)
    report["fsdp_vs_ddp_max_diff"] = max_diff(fsdp_weights, full_weights)
    report["fsdp_is_fsdp"] = fsdp_full.is_fsdp_enabled
    report["fsdp_checkpoint_files"] = sorted(p.name for p in (OUT / "fsdp" / "checkpoint-2").iterdir())
    fsdp_resumed = train(
        "fsdp_resumed", fresh_model(seed=5), resume=str(OUT / "fsdp" / "checkpoint-2"), **fsdp
    )
    report["fsdp_resume_max_diff"] = max_diff(weights(fsdp_resumed), fsdp_weights)

    # ---- the helpers' other formats, directly on the FSDP-trained model and optimizer -----------
    import copy

    from accelerate.utils import load_fsdp_model, load_fsdp_optimizer, save_fsdp_model, save_fsdp_optimizer

    acc, model, opt = fsdp_full.accelerator, fsdp_full.model, fsdp_full.optimizer
    plugin = copy.copy(acc.state.fsdp_plugin)
    plugin.state_dict_type = "SHARDED_STATE_DICT"
    saved_opt = acc.strategy.optimizer_state_dict(model, opt.optimizer, full=True)
    for use_dcp in (True, False):
        folder = OUT / f"helpers_dcp{int(use_dcp)}"
        save_fsdp_model(plugin, acc, model, folder, use_dcp=use_dcp)
        save_fsdp_optimizer(plugin, acc, opt, model, folder, use_dcp=use_dcp)
        with torch.no_grad():
            for p in model.parameters():
                p.zero_()
        for state in opt.optimizer.state.values():
            state["exp_avg"].zero_()
        load_fsdp_model(plugin, acc, model, folder, use_dcp=use_dcp)
        load_fsdp_optimizer(plugin, acc, opt, model, folder, use_dcp=use_dcp)
        back = acc.strategy.optimizer_state_dict(model, opt.optimizer, full=True)
        report[f"helpers_dcp{int(use_dcp)}"] = {
            "model_max_diff": max_diff(weights(fsdp_full), fsdp_weights),
            "optimizer_equal": not main_process()
            or all(
                torch.equal(back["state"][k]["exp_avg"], saved_opt["state"][k]["exp_avg"])
                for k in saved_opt["state"]
            ),
            "files": sorted(p.name for p in folder.iterdir()),
        }

report["seconds_after_imports"] = round(time.perf_counter() - STARTED, 2)
if main_process():
    (OUT / f"{MODE}.json").write_text(json.dumps(report, indent=1))
print(
    f"compat trainer {MODE} done on rank {torch.distributed.get_rank() if torch.distributed.is_initialized() else 0}"
)
