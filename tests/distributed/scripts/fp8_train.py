"""torchao fp8 (tensorwise, rowwise) on 2 gloo ranks under DDP and FSDP2, against bf16 on the same
steps: the loss falls, the fp8 run ends within FP8_VS_BF16 of the bf16 run,
and FSDP2 all-gathers the weights in fp8 when asked. Under DeepSpeed ZeRO-2 and ZeRO-3 (a bf16
engine), fp8 through accelerando equals torchao + `deepspeed.initialize` written by hand, loss for
loss and weight for weight. One launch for all of it."""

from __future__ import annotations

import torch
import torch.distributed as dist

from accelerando import Accelerator, AORecipeKwargs, FullyShardedDataParallelPlugin
from accelerando.state import PartialState, reset_runtime
from accelerando.utils import DeepSpeedPlugin

STEPS = 12
FP8_VS_BF16 = 0.05  # relative difference of the final loss (fp8 rounding vs bf16 rounding)


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 128), torch.nn.GELU(),
        torch.nn.Linear(128, 64), torch.nn.GELU(), torch.nn.Linear(64, 16),
    )  # fmt: skip


def data(rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A fixed teacher's outputs: a learnable target, each rank its own half of every batch."""
    torch.manual_seed(1)
    teacher = torch.nn.Sequential(torch.nn.Linear(64, 16), torch.nn.Tanh())
    g = torch.Generator().manual_seed(100 + rank)
    out = []
    for _ in range(STEPS):
        x = torch.randn(16, 64, generator=g)
        with torch.no_grad():
            out.append((x, teacher(x)))
    return out


def train(
    precision: str, fsdp: bool, recipe: AORecipeKwargs | None = None
) -> tuple[list[float], torch.nn.Module]:
    reset_runtime()
    acc = Accelerator(
        mixed_precision=precision,
        fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2) if fsdp else None,
        kwargs_handlers=[recipe] if recipe is not None else None,
    )
    net = model()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    net, opt = acc.prepare(net, opt)
    assert acc.distributed_type == ("FSDP" if fsdp else "MULTI_CPU"), acc.distributed_type
    losses = []
    for x, y in data(acc.process_index):
        loss = torch.nn.functional.mse_loss(net(x), y)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        mean = loss.detach().clone()
        dist.all_reduce(mean, op=dist.ReduceOp.AVG)
        losses.append(mean.item())
    return losses, net


def _zero(stage: int) -> dict:
    return {
        "train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
        "zero_optimization": {"stage": stage}, "bf16": {"enabled": True},
    }  # fmt: skip


def deepspeed_fp8(stage: int, recipe: str) -> tuple[list[float], list[float], bool]:
    """(accelerando's losses, by hand's losses, equal full weights) for one ZeRO stage and recipe."""
    import deepspeed
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    from accelerando.precision.fp8 import default_fp8_filter

    reset_runtime()
    acc = Accelerator(
        mixed_precision="fp8",
        deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=_zero(stage)),
        kwargs_handlers=[AORecipeKwargs(recipe_name=recipe)],
    )
    net = model()
    engine, opt = acc.prepare(net, torch.optim.AdamW(net.parameters(), lr=1e-2))
    ours = []
    for x, y in data(acc.process_index):
        loss = torch.nn.functional.mse_loss(engine(x), y)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        ours.append(loss.item())
    ours_weights = acc.get_state_dict(engine)

    config = Float8LinearConfig.from_recipe_name(recipe)
    net = convert_to_float8_training(model(), config=config, module_filter_fn=default_fp8_filter)
    hand, _, _, _ = deepspeed.initialize(
        model=net, optimizer=torch.optim.AdamW(net.parameters(), lr=1e-2), config=_zero(stage),
        dist_init_required=False,
    )  # fmt: skip
    theirs = []
    for x, y in data(acc.process_index):
        with torch.autocast("cpu", dtype=torch.bfloat16):  # torchao's recipe: fp8 GEMMs under bf16 autocast
            out = hand(x)
        loss = torch.nn.functional.mse_loss(out.float(), y)
        hand.backward(loss)
        hand.step()
        theirs.append(loss.item())
    with deepspeed.zero.GatheredParameters(list(hand.module.parameters()), enabled=stage == 3):
        same = all(
            torch.equal(a.float(), b.float())
            for a, b in zip(ours_weights.values(), hand.module.state_dict().values())
        )
    assert sum(type(m).__name__ == "Float8Linear" for m in acc.unwrap_model(engine).modules()) == 4
    return ours, theirs, same


def main() -> None:
    import time

    from torchao.float8.float8_linear import Float8Linear

    start = time.perf_counter()
    state = PartialState()
    rank = state.process_index
    rows = []
    for fsdp in (False, True):
        kind = "FSDP2" if fsdp else "DDP"
        bf16, _ = train("bf16", fsdp)
        for name in ("tensorwise", "rowwise"):
            gather8 = fsdp and name == "tensorwise"  # torchao's fp8 all-gather (tensorwise only)
            recipe = AORecipeKwargs(recipe_name=name, enable_fsdp_float8_all_gather=gather8 or None)
            fp8, net = train("fp8", fsdp, recipe)
            inner = net.module if hasattr(net, "module") else net
            assert sum(isinstance(m, Float8Linear) for m in inner.modules()) == 4, inner
            assert fp8[-1] < 0.6 * fp8[0], (kind, name, fp8)  # it learns
            gap = abs(fp8[-1] - bf16[-1]) / bf16[-1]
            assert gap < FP8_VS_BF16, (kind, name, fp8[-1], bf16[-1])
            if fsdp:
                weight = inner[0].weight
                assert type(weight).__name__ == "DTensor", type(weight)
                local = weight.to_local()
                assert type(local).__name__ == (
                    "WeightWithDynamicFloat8CastTensor" if gather8 else "Tensor"
                ), type(local)
            rows.append(
                f"{kind:5} {name:10} loss {fp8[0]:.4f} -> {fp8[-1]:.4f}  bf16 -> {bf16[-1]:.4f}  gap {gap:.3f}"
            )
    try:
        import deepspeed  # noqa: F401
    except ImportError:
        rows.append("DeepSpeed not installed: its fp8 rows skipped")
    else:
        for stage, name in ((2, "tensorwise"), (3, "rowwise")):
            ours, theirs, same = deepspeed_fp8(stage, name)
            assert ours == theirs and same, (stage, name, ours, theirs, same)
            assert ours[-1] < 0.6 * ours[0], (stage, name, ours)
            rows.append(f"ZeRO-{stage} {name:10} loss {ours[0]:.4f} -> {ours[-1]:.4f}  == by hand")
    if rank == 0:
        print("\n".join(rows))
        print(f"fp8 checks took {time.perf_counter() - start:.1f} s")
        print("FP8_TRAIN_OK")


if __name__ == "__main__":
    main()
