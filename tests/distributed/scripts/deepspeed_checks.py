"""DeepSpeed on 2 gloo ranks, every check in one launch, each against plain PyTorch on the same data.

1. ZeRO-0/1/2/3 with accumulation and clipping == DDP (params, losses, pre-clip norms), with the
   batch size, accumulation and clipping filled from the Accelerator ("auto").
2. DummyOptim / DummyScheduler: the config's optimizer and scheduler == torch AdamW + the same warmup.
3. A ZeRO-2 student distilled from a ZeRO-3 teacher (two plugins) == the same distillation in
   PyTorch; save_state -> more steps -> load_state -> the same steps again is bit-identical for both
   engines; get_state_dict / GatheredParameters / unwrap_model / load of whole weights per engine.
   save_model of the frozen ZeRO-3 teacher: safetensors that load into the plain model, same outputs.
4. A tiny Llama built partitioned (zero3_init_flag) under ZeRO-3, trained, save_model -> transformers'
   from_pretrained gives the engine's logits.
5. A contradiction found at prepare (config batch size vs the loader) stops before any engine.
Checks 1 and 3 also save_state mid-run and record what the uninterrupted run reached; `--work DIR
resume`, a second launch (fresh processes), loads those checkpoints into newly built engines (other
initial weights), trains the rest and must reach exactly the same weights and losses.
Prints DEEPSPEED_OK at the end.
"""

from __future__ import annotations

import copy
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

from accelerando import Accelerator
from accelerando.state import PartialState
from accelerando.utils import DeepSpeedPlugin, DummyOptim, DummyScheduler, GatheredParameters

DIM, ROWS, STEPS, ACCUM, CLIP, LR = 8, 4, 6, 2, 0.05, 1e-2


def net(seed: int = 0, width: int = 16) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(DIM, width), torch.nn.Tanh(), torch.nn.Linear(width, 1))


def loader() -> DataLoader:
    g = torch.Generator().manual_seed(7)
    x, y = torch.randn(ROWS * 2 * STEPS, DIM, generator=g), torch.randn(ROWS * 2 * STEPS, 1, generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=ROWS)


def mse(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(out, y)


def ddp_reference(batches, accum=ACCUM, clip=CLIP, optimizer=None):
    """Plain PyTorch: DDP, loss / accum, no_sync inside the window, clip_grad_norm_, AdamW."""
    model = DistributedDataParallel(net())
    opt = optimizer(model.parameters()) if optimizer else torch.optim.AdamW(model.parameters(), lr=LR)
    losses, norms = [], []
    for i, (x, y) in enumerate(batches):
        sync = (i + 1) % accum == 0
        loss = mse(model(x), y)
        losses.append(loss.item())
        if sync:
            (loss / accum).backward()
            norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), clip or float("inf")).item())
            opt.step()
            opt.zero_grad()
        else:
            with model.no_sync():
                (loss / accum).backward()
    return model.module, losses, norms


def full_params(acc: Accelerator, model) -> list[torch.Tensor]:
    state = acc.get_state_dict(model)
    got = [None]
    if dist.get_rank() == 0:
        got = [list(state.values())]
    dist.broadcast_object_list(got, src=0)
    return got[0]


def close(a, b, what, tol=1e-5):
    for x, y in zip(a, b):
        err = (x - y).abs().max().item()
        assert err <= tol, f"{what}: max difference {err}"


def expect_path(work: Path, key: str) -> Path:
    """What the uninterrupted run reached, per rank, for the fresh-process resume to compare with."""
    return work / "expect" / f"{key}_rank{dist.get_rank()}.pt"


def record(work: Path, key: str, value: object) -> None:
    expect_path(work, key).parent.mkdir(exist_ok=True)
    torch.save(value, expect_path(work, key))


def stage_step(acc, model, opt, x, y) -> tuple[float, float | None]:
    with acc.accumulate(model):
        loss = mse(model(x), y)
        acc.backward(loss)
        norm = acc.clip_grad_norm_(model.parameters(), CLIP).item() if acc.sync_gradients else None
        opt.step()
        opt.zero_grad()
    return loss.item(), norm


SAVE_AT = 2  # batches (one accumulation window) before the stage checks save_state


def check_stages(work: Path) -> None:
    for stage in (0, 1, 2, 3):
        plugin = DeepSpeedPlugin(zero_stage=stage, zero3_init_flag=False)  # the Llama check covers the flag
        acc = Accelerator(deepspeed_plugin=plugin, gradient_accumulation_steps=ACCUM)
        model = net()
        opt = torch.optim.AdamW(model.parameters(), lr=LR)
        model, opt, dl = acc.prepare(model, opt, loader())
        engine_config = model.config
        assert engine_config["train_micro_batch_size_per_gpu"] == ROWS, engine_config
        assert engine_config["train_batch_size"] == ROWS * ACCUM * 2
        assert engine_config["gradient_accumulation_steps"] == ACCUM
        assert engine_config["gradient_clipping"] == 0.0  # "auto": clip_grad_norm_ decides
        assert model.dp_world_size == 2 and acc.num_processes == 2  # the runtime's group, 2 ranks
        batches, losses, norms = [], [], []
        for i, (x, y) in enumerate(dl):
            if i == SAVE_AT and stage > 0:  # the fresh-process resume starts here
                acc.save_state(str(work / f"zero{stage}"))
            batches.append((x.clone(), y.clone()))
            loss, norm = stage_step(acc, model, opt, x, y)
            losses.append(loss)
            norms += [norm] if norm is not None else []
        ref, ref_losses, ref_norms = ddp_reference(batches)
        close(torch.tensor(losses), torch.tensor(ref_losses), f"ZeRO-{stage} losses")
        close(torch.tensor(norms), torch.tensor(ref_norms), f"ZeRO-{stage} pre-clip norms")
        final = full_params(acc, model)
        close(final, list(ref.state_dict().values()), f"ZeRO-{stage} params")
        if stage > 0:
            record(work, f"zero{stage}", {"losses": losses[SAVE_AT:], "params": final})
        assert acc.unwrap_model(model) is model.module
        acc.free_memory()
    PartialState().print("stages OK")


def check_dummies() -> None:
    config = {
        "zero_optimization": {"stage": 1},
        "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto", "torch_adam": True}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                     "warmup_num_steps": "auto", "warmup_type": "linear"}},
    }  # fmt: skip
    acc = Accelerator(
        deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=config), gradient_accumulation_steps=ACCUM
    )
    model = net()
    opt = DummyOptim(model.parameters(), lr=LR, weight_decay=0.0)
    sched = DummyScheduler(opt, warmup_num_steps=2)
    model, opt, sched, dl = acc.prepare(model, opt, sched, loader())
    assert type(opt.optimizer.optimizer).__name__ == "AdamW", type(opt.optimizer)
    assert model.config["scheduler"]["params"]["warmup_max_lr"] == LR  # "auto" from the DummyOptim
    batches, lrs = [], []  # lrs: the learning rate each optimizer step used
    for x, y in dl:
        batches.append((x.clone(), y.clone()))
        with acc.accumulate(model):
            if acc.sync_gradients:
                lrs.append(sched.get_last_lr()[0])
            acc.backward(mse(model(x), y))
            opt.step()
            sched.step()
            opt.zero_grad()
    assert lrs == sorted(lrs) and lrs[0] < lrs[-1] <= LR, lrs  # the config's warmup drives the steps

    def same_lrs_adamw(params):
        opt = torch.optim.AdamW(params, lr=LR, weight_decay=0.0)
        step, used = opt.step, iter(lrs)

        def step_at_lr(*a, **k):
            for group in opt.param_groups:
                group["lr"] = next(used)
            step(*a, **k)

        opt.step = step_at_lr
        return opt

    ref, _, _ = ddp_reference(batches, clip=None, optimizer=same_lrs_adamw)
    close(full_params(acc, model), list(ref.state_dict().values()), "DummyOptim params", tol=1e-5)
    acc.free_memory()
    PartialState().print("dummies OK")


def distill_step(acc, student, teacher, opt, x, y):
    with acc.accumulate(student):
        with torch.no_grad():
            target = teacher(x)
        loss = mse(student(x), target) + mse(student(x), y)
        acc.backward(loss)
        acc.clip_grad_norm_(student.parameters(), CLIP)
        opt.step()
        opt.zero_grad()
    return loss.item()


def check_distillation_and_round_trip(work: Path) -> None:
    plugins = {
        "student": DeepSpeedPlugin(zero_stage=2),
        "teacher": DeepSpeedPlugin(zero_stage=3, zero3_init_flag=False),
    }
    acc = Accelerator(deepspeed_plugins=plugins, gradient_accumulation_steps=ACCUM)
    assert acc.state.deepspeed_plugin is plugins["student"] and plugins["student"].selected
    teacher_init = net(seed=1, width=32)
    student = net()
    opt = torch.optim.AdamW(student.parameters(), lr=LR)
    student, opt, dl = acc.prepare(student, opt, loader())
    acc.state.select_deepspeed_plugin("teacher")
    teacher = acc.prepare(copy.deepcopy(teacher_init).requires_grad_(False))
    acc.state.select_deepspeed_plugin("student")
    assert teacher.zero_optimization_stage() == 3 and student.zero_optimization_stage() == 2
    assert all(p.ds_tensor.numel() < p.ds_numel for p in teacher.module.parameters() if p.ds_numel > 1)
    # The teacher's whole weights come back from its ZeRO-3 partitions.
    close(full_params(acc, teacher), list(teacher_init.state_dict().values()), "teacher gather", tol=0)
    with GatheredParameters(list(teacher.module.parameters())):  # whole tensors inside, partitions after
        whole = [p.detach().clone() for p in teacher.module.parameters()]
    close(whole, list(teacher_init.parameters()), "GatheredParameters", tol=0)

    batches = [(x.clone(), y.clone()) for x, y in dl]
    losses = [distill_step(acc, student, teacher, opt, x, y) for x, y in batches[:4]]

    # Plain PyTorch distillation on the same batches.
    ref = DistributedDataParallel(net())
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=LR)
    ref_losses = []
    for i, (x, y) in enumerate(batches[:4]):
        sync = (i + 1) % ACCUM == 0
        with torch.no_grad():
            target = teacher_init(x)
        loss = mse(ref(x), target) + mse(ref(x), y)
        ref_losses.append(loss.item())
        ctx = torch.enable_grad() if sync else ref.no_sync()
        with ctx:
            (loss / ACCUM).backward()
        if sync:
            torch.nn.utils.clip_grad_norm_(ref.parameters(), CLIP)
            ref_opt.step()
            ref_opt.zero_grad()
    close(torch.tensor(losses), torch.tensor(ref_losses), "distillation losses")
    close(full_params(acc, student), list(ref.module.state_dict().values()), "distilled student")

    # save -> 2 more windows -> load -> the same 2 windows again: bit-identical, both engines.
    folder = acc.save_state(str(work / "ckpt"))
    names = {p.name for p in Path(folder).rglob("*") if p.is_file()}
    assert {"mp_rank_00_model_states.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt"} <= names, names
    assert "frozen_weights_rank_1.bin" in names and "manifest.json" in names, names
    after = [distill_step(acc, student, teacher, opt, x, y) for x, y in batches[4:8]]
    params_after = [p.clone() for p in full_params(acc, student)]
    with torch.no_grad():  # disturb the teacher so loading must restore its partitions
        for p in teacher.module.parameters():
            p.ds_tensor.add_(1.0)
    acc.load_state(folder)
    close(full_params(acc, teacher), list(teacher_init.state_dict().values()), "teacher after load", tol=0)
    check_teacher_save_model(acc, teacher, teacher_init, batches[0][0], work / "teacher")
    record(work, "distill", {"batches": batches[4:8], "losses": after, "params": params_after})
    again = [distill_step(acc, student, teacher, opt, x, y) for x, y in batches[4:8]]
    assert again == after, (again, after)
    close(full_params(acc, student), params_after, "student after resume", tol=0)

    # Whole weights into an engine (master copies too): loading its own state changes nothing.
    state = acc.get_state_dict(student)
    acc.strategy.load_model_state_dict(student, state)
    close(full_params(acc, student), params_after, "load_model_state_dict", tol=0)
    assert acc.unwrap_model(teacher) is teacher.module
    acc.free_memory()
    PartialState().print("distillation OK")


def check_teacher_save_model(acc, teacher, teacher_init, x, out: Path) -> None:
    """save_model of the frozen ZeRO-3 teacher (no optimizer): safetensors that load into the plain
    model, which then gives the engine's outputs."""
    from safetensors.torch import load_file

    with torch.no_grad():
        engine_out = teacher(x)  # collective under ZeRO-3: every rank runs it
    acc.save_model(teacher, str(out))
    acc.wait_for_everyone()
    if acc.is_main_process:
        files = sorted(out.glob("*.safetensors"))
        assert files and not list(out.glob("*.bin")), sorted(p.name for p in out.iterdir())
        plain = net(seed=5, width=32)  # other initial weights: everything must come from the files
        plain.load_state_dict({k: v for f in files for k, v in load_file(f).items()})
        with torch.no_grad():
            close([plain(x)], [engine_out], "saved teacher's outputs", tol=0)
            close([plain(x)], [teacher_init(x)], "saved teacher vs the original", tol=0)
    acc.wait_for_everyone()


def check_resume_in_fresh_processes(work: Path) -> None:
    """Run by a second launch: every checkpoint of the first, loaded into newly built engines whose
    initial weights differ, continues exactly as the uninterrupted run did (weights bit-identical)."""
    for stage in (1, 2, 3):
        want = torch.load(expect_path(work, f"zero{stage}"))
        plugin = DeepSpeedPlugin(zero_stage=stage, zero3_init_flag=False)
        acc = Accelerator(deepspeed_plugin=plugin, gradient_accumulation_steps=ACCUM)
        model = net(seed=9)
        opt = torch.optim.AdamW(model.parameters(), lr=LR)
        model, opt, dl = acc.prepare(model, opt, loader())
        acc.load_state(str(work / f"zero{stage}"))
        losses = [stage_step(acc, model, opt, x, y)[0] for x, y in acc.skip_first_batches(dl, SAVE_AT)]
        assert losses == want["losses"], (stage, losses, want["losses"])
        close(full_params(acc, model), want["params"], f"ZeRO-{stage} resumed in a new process", tol=0)
        acc.free_memory()

    want = torch.load(expect_path(work, "distill"))
    plugins = {
        "student": DeepSpeedPlugin(zero_stage=2),
        "teacher": DeepSpeedPlugin(zero_stage=3, zero3_init_flag=False),
    }
    acc = Accelerator(deepspeed_plugins=plugins, gradient_accumulation_steps=ACCUM)
    student = net(seed=9)
    opt = torch.optim.AdamW(student.parameters(), lr=LR)
    student, opt, _ = acc.prepare(student, opt, loader())
    acc.state.select_deepspeed_plugin("teacher")
    teacher = acc.prepare(net(seed=5, width=32).requires_grad_(False))  # its weights come from the checkpoint
    acc.state.select_deepspeed_plugin("student")
    acc.load_state(str(work / "ckpt"))
    losses = [distill_step(acc, student, teacher, opt, x, y) for x, y in want["batches"]]
    assert losses == want["losses"], (losses, want["losses"])
    close(full_params(acc, student), want["params"], "distillation resumed in a new process", tol=0)
    acc.free_memory()
    PartialState().print("fresh resume OK")


def check_llama_zero3(work: Path) -> None:
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
    from transformers.integrations import is_deepspeed_zero3_enabled, unset_hf_deepspeed_config

    plugin = DeepSpeedPlugin(zero_stage=3, zero3_init_flag=True)
    acc = Accelerator(deepspeed_plugin=plugin)
    assert is_deepspeed_zero3_enabled()
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    assert all(p.ds_tensor.numel() < p.ds_numel for p in model.parameters()), "not built partitioned"
    ids = torch.randint(0, 64, (8, 12), generator=torch.Generator().manual_seed(3))
    dl = DataLoader(TensorDataset(ids), batch_size=2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt, dl = acc.prepare(model, opt, dl)
    for (batch,) in dl:
        acc.backward(model(input_ids=batch, labels=batch).loss)
        opt.step()
        opt.zero_grad()
    probe = ids[:2]
    with torch.no_grad():
        logits = model(input_ids=probe).logits
    out = work / "llama"
    acc.save_model(model, str(out), max_shard_size="40KB")
    if acc.is_main_process:
        acc.unwrap_model(model).config.save_pretrained(out)
    acc.wait_for_everyone()
    unset_hf_deepspeed_config()
    if acc.is_main_process:
        assert (out / "model.safetensors.index.json").is_file()  # sharded
        loaded = LlamaForCausalLM.from_pretrained(out)
        with torch.no_grad():
            again = loaded(input_ids=probe).logits
        close([again], [logits], "from_pretrained logits", tol=1e-5)
    acc.wait_for_everyone()
    acc.free_memory()
    PartialState().print("llama OK")


def check_refused_at_prepare() -> None:
    import deepspeed

    built = []
    real = deepspeed.initialize
    deepspeed.initialize = lambda **kw: built.append(kw) or real(**kw)
    try:
        plugin = DeepSpeedPlugin(
            hf_ds_config={"train_micro_batch_size_per_gpu": 3, "zero_optimization": {"stage": 2}}
        )
        acc = Accelerator(deepspeed_plugin=plugin)
        model = net()
        try:
            acc.prepare(model, torch.optim.AdamW(model.parameters()), loader())
        except ValueError as err:
            assert "train_micro_batch_size_per_gpu=3" in str(err) and "batch size 4" in str(err), err
        else:
            raise AssertionError("a contradictory batch size was accepted")
        assert built == [], "an engine was built before the refusal"
    finally:
        deepspeed.initialize = real
    PartialState().print("refusal OK")


def main() -> None:
    PartialState()
    args = sys.argv[1:]
    given = args[args.index("--work") + 1] if "--work" in args else None
    checks = [a for a in args if a != "--work" and a != given]
    with tempfile.TemporaryDirectory() as tmp:
        shared = [given or tmp]
        dist.broadcast_object_list(shared, src=0)
        work = Path(shared[0])
        checks = checks or ["stages", "dummies", "distill", "llama", "refused"]
        if "stages" in checks:
            check_stages(work)
        if "dummies" in checks:
            check_dummies()
        if "distill" in checks:
            check_distillation_and_round_trip(work)
        if "llama" in checks:
            check_llama_zero3(work)
        if "refused" in checks:
            check_refused_at_prepare()
        if "resume" in checks:
            check_resume_in_fresh_processes(work)
        dist.barrier()
    PartialState().print("DEEPSPEED_OK")


if __name__ == "__main__":
    main()
