"""FSDP2 vs DDP parity on 2 gloo ranks: plain steps, accumulation, variants, a transformers model."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

sys.path.insert(0, str(Path(__file__).parent))
from fsdp_common import Net, assert_close, batch, ddp_reference, full_params, make_net  # noqa: E402

from accelerando import Accelerator  # noqa: E402
from accelerando.config.fsdp import FullyShardedDataParallelPlugin  # noqa: E402
from accelerando.state import PartialState  # noqa: E402


def mse(model: torch.nn.Module, step: int) -> torch.Tensor:
    x, y = batch(step)
    return torch.nn.functional.mse_loss(model(x), y)


def train_fsdp(model, plugin, steps, accum=1, clip=None, lr=1e-2, **acc_kwargs):
    acc = Accelerator(fsdp_plugin=plugin, gradient_accumulation_steps=accum, **acc_kwargs)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)  # created before prepare, as users do
    model, opt = acc.prepare(model, opt)
    losses, grads_after_first = [], None
    for step in range(steps):
        with acc.accumulate(model):
            loss = mse(model, step)
            acc.backward(loss)
            if step == 0:
                grads_after_first = [p.grad for p in model.parameters()]
            if clip is not None and acc.sync_gradients:
                acc.clip_grad_norm_(model.parameters(), clip)
            opt.step()
            opt.zero_grad()
        losses.append(loss.item())
    return acc, model, losses, grads_after_first


def check_parity(name, plugin, steps=4, accum=1, clip=None, depth=3, frozen_out=False, **acc_kwargs):
    base = make_net(depth=depth)
    base.out.requires_grad_(not frozen_out)
    ref_losses, ref_params = ddp_reference(base, mse, steps, accum=accum, clip=clip)
    acc, model, losses, first = train_fsdp(
        copy.deepcopy(base), plugin, steps, accum=accum, clip=clip, **acc_kwargs
    )
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=1e-6)
    assert_close(full_params(model), ref_params, name)
    return acc, model, first


def main() -> None:
    PartialState()  # joins the gloo group the DDP reference needs
    acc, model, _ = check_parity("plain", FullyShardedDataParallelPlugin(), clip=0.05)
    assert acc.is_fsdp2 and acc.distributed_type == "FSDP"
    strategy = acc.strategy
    assert strategy.plans[0].classes == ("Block",) * 3, strategy.plans[0]
    # Every parameter is a DTensor and this rank stores about half of the model.
    params = list(model.parameters())
    assert all(isinstance(p, DTensor) for p in params)
    local = sum(p.to_local().numel() for p in params)
    total = sum(p.numel() for p in params)
    assert abs(local / total - 0.5) < 0.02, (local, total)

    # Accumulation: the non-boundary backward leaves no synced (sharded) gradient behind.
    _, _, first = check_parity("accum", FullyShardedDataParallelPlugin(), steps=6, accum=3, clip=0.05)
    assert all(g is None for g in first), "gradients were reduce-scattered on a non-boundary step"

    # FSDP1-era and FSDP2 options: same numbers.
    variant = FullyShardedDataParallelPlugin(
        sharding_strategy="SHARD_GRAD_OP",
        activation_checkpointing=True,
        forward_prefetch=True,
        cpu_offload=True,
        auto_wrap_policy="size_based_wrap",
        min_num_params=500,
    )
    acc, model, _ = check_parity("variant", variant, steps=3, accum=1)
    assert variant.reshard_after_forward is False
    assert len(acc.strategy.plans[0].modules) >= 3

    # HYBRID_SHARD: a (nodes, ranks per node) = (1, 2) mesh; same numbers.
    acc, model, _ = check_parity(
        "hybrid", FullyShardedDataParallelPlugin(sharding_strategy="HYBRID_SHARD"), steps=2
    )
    assert acc.strategy.mesh().mesh_dim_names == ("dp_replicate", "dp_shard")

    # torch.compile (the facade compiles blocks in place before sharding): same numbers.
    from accelerando.config.options import TorchDynamoPlugin

    check_parity(
        "compiled",
        FullyShardedDataParallelPlugin(),
        steps=2,
        dynamo_plugin=TorchDynamoPlugin(backend="aot_eager"),
    )

    check_checkpointing_compile_and_sharding()

    # Two models and one optimizer over both (GAN-style): every parameter is re-bound.
    acc = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin())
    first, second = make_net(depth=2), make_net(seed=1, depth=2)
    opt = torch.optim.SGD([*first.parameters(), *second.parameters()], lr=0.1)
    first, second, opt = acc.prepare(first, second, opt)
    live = {id(p) for p in [*first.parameters(), *second.parameters()]}
    assert {id(p) for p in opt.param_groups[0]["params"]} == live
    acc.backward(mse(first, 0) + mse(second, 1))
    opt.step()

    # ignored_modules (here a frozen head, the documented use) stay plain tensors and unsharded.
    acc, model, _ = check_parity(
        "ignored", FullyShardedDataParallelPlugin(ignored_modules="out"), frozen_out=True
    )
    assert not isinstance(model.out.weight, DTensor) and isinstance(model.inp.weight, DTensor)

    # Mixed precision policy: bf16 compute, fp32 master shards, fp32 outputs.
    acc = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(mixed_precision_policy="bf16"))
    model = acc.prepare(make_net(depth=1))
    out = model(batch(0)[0])
    assert out.dtype == torch.float32, out.dtype
    assert all(p.dtype == torch.float32 for p in model.parameters())

    # An optimizer prepared separately from its model is refused with a clear error.
    acc = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin())
    net = make_net(depth=1)
    stale = torch.optim.SGD(net.parameters(), lr=0.1)
    net = acc.prepare(net)
    stale = acc.prepare(stale)
    mse(net, 0).backward()
    try:
        stale.step()
    except ValueError as err:
        assert "replaced with shards" in str(err)
    else:
        raise AssertionError("stale optimizer stepped")

    check_environment_selects_fsdp()
    check_transformers()
    check_fp16_overflow_agreement()  # last: it replaces the runtime's precision
    if dist.get_rank() == 0:
        print("FSDP_TRAIN_OK")


def check_checkpointing_compile_and_sharding() -> None:
    """Activation checkpointing + compile + FSDP2 in one model (AC, then compile, then sharding):
    the same numbers as DDP, with graphs really captured, whole-model and per block."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from accelerando.config.options import TorchDynamoPlugin
    from accelerando.parallel.activation_checkpointing import is_checkpointed

    for regional in (False, True):
        torch._dynamo.reset()
        counters.clear()
        acc, model, _ = check_parity(
            f"checkpointed+compiled (regional={regional})",
            FullyShardedDataParallelPlugin(activation_checkpointing=True),
            steps=3,
            dynamo_plugin=TorchDynamoPlugin(backend="aot_eager", use_regional_compilation=regional),
        )
        assert all(is_checkpointed(block) for block in model.blocks)
        assert counters["stats"]["unique_graphs"] >= 1, dict(counters["stats"])
        assert not counters["graph_break"], dict(counters["graph_break"])
        assert all(isinstance(p, DTensor) for p in model.parameters())


def check_environment_selects_fsdp() -> None:
    """What `accelerando launch --use_fsdp --fsdp_*` exports is enough: Accelerator() with no plugin."""
    from accelerando.config.env import patch_environment

    with patch_environment(
        ACCELERANDO_USE_FSDP="true",
        FSDP_VERSION="2",
        FSDP_AUTO_WRAP_POLICY="SIZE_BASED_WRAP",
        FSDP_MIN_NUM_PARAMS="100",
        FSDP_RESHARD_AFTER_FORWARD="false",
        FSDP_STATE_DICT_TYPE="FULL_STATE_DICT",
    ):
        acc = Accelerator()
        model = acc.prepare(make_net(depth=2))
    assert acc.distributed_type == "FSDP"
    plugin = acc.strategy.plugin
    assert plugin.reshard_after_forward is False and plugin.state_dict_type == "FULL_STATE_DICT"
    assert acc.strategy.plans[0].policy == "size_based_wrap" and len(acc.strategy.plans[0].modules) >= 2
    assert all(isinstance(p, DTensor) for p in model.parameters())


def check_fp16_overflow_agreement() -> None:
    """An inf in one rank's gradient shard makes every rank skip the step and back off the scale."""
    from accelerando.state import reset_runtime

    reset_runtime()
    acc = Accelerator(mixed_precision="fp16", fsdp_plugin=FullyShardedDataParallelPlugin())
    model = make_net(depth=1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt = acc.prepare(model, opt)
    for step in range(4):
        before = {k: v.clone() for k, v in full_params(model).items()}
        scale = acc.scaler.get_scale()
        acc.backward(mse(model, step))
        if step == 2 and dist.get_rank() == 1:
            next(model.parameters()).grad.to_local().view(-1)[0] = float("inf")
        opt.step()
        opt.zero_grad()
        scales = [None, None]
        dist.all_gather_object(scales, (acc.scaler.get_scale(), acc.optimizer_step_was_skipped))
        assert scales[0] == scales[1], scales
        if step == 2:
            assert scales[0] == (scale / 2, True), scales
            assert_close(full_params(model), before, "skipped step", tol=0)


def check_transformers() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    base = LlamaForCausalLM(config)

    def lm_loss(model: torch.nn.Module, step: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(step)
        ids = torch.randint(0, 64, (4, 12), generator=g)[dist.get_rank() * 2 : dist.get_rank() * 2 + 2]
        return model(input_ids=ids, labels=ids).loss

    ref_losses, ref_params = ddp_reference(base, lm_loss, 3, lr=1e-3)
    acc = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(verbose=True))
    model = copy.deepcopy(base)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt = acc.prepare(model, opt)
    plan = acc.strategy.plans[0]
    assert plan.classes == ("LlamaDecoderLayer",) * 2, plan
    assert "_no_split_modules" in plan.reason
    losses = []
    for step in range(3):
        loss = lm_loss(model, step)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=1e-6)
    assert_close(full_params(model), ref_params, "llama")


if __name__ == "__main__":
    assert isinstance(Net, type)
    main()
