"""FP8 suite: every fp8 backend present, (1) used by hand vs through accelerando, then (2) against BF16.

(1) Integration: a small transformer, same seed and data, trained a few steps with the backend's own
    API written by hand and through `Accelerator(mixed_precision="fp8")`; losses and final weights
    must be equal (a mismatch is an accelerando bug: the table says so and the exit status is 1).
(2) Comparison: BF16 autocast and each fp8 backend/recipe trained the same N steps on the model
    size asked for, each in its own process (so its peak memory is its own): median step time,
    peak memory, final loss.
A backend this machine cannot run gets a row that says why (the capability probe's reasons).

    python benchmarks/fp8/run.py --smoke     # CPU, seconds: tiny model, 3 steps, one process
    python benchmarks/fp8/run.py             # CPU, a few minutes: small model, 10 steps, a process per row
    python benchmarks/fp8/run.py --gpu       # one CUDA GPU (H100/H200): ~1.0 B params, 200 steps,
                                             # bf16 vs torchao tensorwise, compiled (regional)

On CPU torchao's fp8 is emulated and slow: torch._scaled_mm took 1.2 s per call for a 512x128x384
GEMM here (a dim-128 model then needs ~30 s a step), so CPU sizes stay tiny; bf16 autocast has no
fast kernels either: the CPU numbers check that the suite runs and that the losses agree,
they say nothing about speed. The speed target (torchao fp8 >= 1.3x bf16 step throughput, final loss
within 1%) is for the --gpu run.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

ROWS = [  # (label, backend, torchao recipe); --rows picks by label
    ("bf16", None, None),
    ("torchao tensorwise", "ao", "tensorwise"),
    ("torchao rowwise", "ao", "rowwise"),
    ("Transformer Engine", "te", None),
    ("MS-AMP O2", "msamp", None),
]


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, d // self.heads).unbind(2)
        attn = nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.proj(attn.transpose(1, 2).reshape(b, s, d))
        return x + self.down(nn.functional.gelu(self.up(self.norm2(x))))


class Transformer(nn.Module):
    def __init__(self, dim: int, depth: int, heads: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(depth))
        self.head = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _device() -> torch.device:
    from accelerando.devices.registry import accelerator_device

    return accelerator_device().torch_device(0 if accelerator_device().type != "cpu" else None)


def _model(dims: dict[str, int]) -> Transformer:
    torch.manual_seed(0)
    return Transformer(dims["dim"], dims["depth"], dims["heads"])


def _batches(
    dims: dict[str, int], steps: int, device: torch.device
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A fixed teacher's outputs, a target the model can learn; a pool of 4 batches taken in turn
    (200 distinct batches of a 1 B model's width would not fit beside it)."""
    torch.manual_seed(1)  # the same teacher for every row, whatever ran before it
    teacher = nn.Linear(dims["dim"], dims["dim"])
    g = torch.Generator().manual_seed(1)
    pool = []
    for _ in range(min(steps, 4)):
        x = torch.randn(dims["batch"], dims["seq"], dims["dim"], generator=g)
        with torch.no_grad():
            pool.append((x.to(device), torch.tanh(teacher(x)).to(device)))
    return [pool[i % len(pool)] for i in range(steps)]


# ---- each backend used by hand, with its own API only ----------------------------------------


def _by_hand(
    backend: str, recipe: str | None, model: nn.Module, device: torch.device
) -> tuple[Any, Any, Any]:
    """(model, optimizer, forward context) as a user of the backend writes it without accelerando."""

    from accelerando.precision.fp8 import default_fp8_filter

    if backend == "ao":
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        config = Float8LinearConfig.from_recipe_name(recipe or "tensorwise")
        model = convert_to_float8_training(model, config=config, module_filter_fn=default_fp8_filter).to(
            device
        )
        return (  # torchao's own recipe: Float8Linear under bf16 autocast
            model,
            torch.optim.AdamW(model.parameters(), lr=1e-3),
            lambda: torch.autocast(device.type, dtype=torch.bfloat16),
        )
    if backend == "te":
        import transformer_engine.pytorch as te
        from transformer_engine.common.recipe import DelayedScaling, Format

        for parent in list(model.modules()):  # TE's documented swap: te.Linear / te.LayerNorm, weights copied
            for name, child in list(parent.named_children()):
                new: nn.Module | None = None
                if type(child) is nn.Linear and default_fp8_filter(child, name):
                    new = te.Linear(child.in_features, child.out_features, params_dtype=child.weight.dtype)
                elif type(child) is nn.LayerNorm:
                    new = te.LayerNorm(
                        child.normalized_shape[0], eps=child.eps, params_dtype=child.weight.dtype
                    )
                if new is not None:
                    with torch.no_grad():
                        new.weight.copy_(child.weight)
                        new.bias.copy_(child.bias)
                    setattr(parent, name, new)
        model = model.to(device)
        fp8_recipe = DelayedScaling(
            fp8_format=Format.HYBRID, amax_history_len=1024, amax_compute_algo="most_recent"
        )
        return (
            model,
            torch.optim.AdamW(model.parameters(), lr=1e-3),
            lambda: _both(
                torch.autocast(device.type, dtype=torch.bfloat16),
                te.fp8_autocast(enabled=True, fp8_recipe=fp8_recipe),
            ),
        )
    import msamp

    model = model.to(device)
    model, opt = msamp.initialize(model, torch.optim.AdamW(model.parameters(), lr=1e-3), opt_level="O2")
    return model, opt, lambda: torch.autocast(device.type, dtype=torch.bfloat16)


def _both(outer: Any, inner: Any) -> Any:
    """Two context managers as one (bf16 autocast around TE's fp8_autocast, as Accelerate nests them)."""
    import contextlib

    stack = contextlib.ExitStack()
    stack.enter_context(outer)
    stack.enter_context(inner)
    return stack


def _through_accelerando(backend: str | None, recipe: str | None, compile: bool = False) -> Any:
    from accelerando import Accelerator, AORecipeKwargs, MSAMPRecipeKwargs, TERecipeKwargs
    from accelerando.utils import TorchDynamoPlugin

    handler: Any = (
        {
            "ao": lambda: AORecipeKwargs(recipe_name=recipe),
            "te": TERecipeKwargs,
            "msamp": lambda: MSAMPRecipeKwargs(opt_level="O2"),
        }[backend]()
        if backend
        else None
    )
    dynamo = TorchDynamoPlugin(backend="inductor", use_regional_compilation=True) if compile else None
    return Accelerator(
        mixed_precision="fp8" if backend else "bf16",
        kwargs_handlers=[handler] if handler else None,
        dynamo_plugin=dynamo,
    )


def _steps(
    model: Any, opt: Any, backward: Any, ctx: Any, batches: list[Any], device: torch.device
) -> tuple[list[float], list[float]]:
    losses, times = [], []
    for x, y in batches:
        start = time.perf_counter()
        with ctx():
            loss = nn.functional.mse_loss(model(x), y)
        backward(loss)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))  # one read per step, in every row alike
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return losses, times


def integration(backend: str, recipe: str | None, dims: dict[str, int], steps: int) -> str:
    """Same steps by hand and through accelerando: "equal", else what differs."""
    import contextlib

    from accelerando.state import reset_runtime

    reset_runtime()
    acc = _through_accelerando(backend, recipe)
    batches = _batches(dims, steps, acc.device)
    model = _model(dims)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt = acc.prepare(model, opt)
    ours, _ = _steps(model, opt, acc.backward, contextlib.nullcontext, batches, acc.device)
    theirs_model, theirs_opt, ctx = _by_hand(backend, recipe, _model(dims), acc.device)
    theirs, _ = _steps(theirs_model, theirs_opt, lambda loss: loss.backward(), ctx, batches, acc.device)
    ours_state = acc.unwrap_model(model).state_dict()
    reset_runtime()
    if ours != theirs:
        return f"DIFFERS: losses by hand {theirs} vs accelerando {ours}"
    for (name, a), b in zip(ours_state.items(), theirs_model.state_dict().values()):
        if torch.is_tensor(a) and not torch.equal(a, b):
            return f"DIFFERS: weight {name} after {steps} steps"
    return "equal"


def measure(backend: str | None, recipe: str | None, args: argparse.Namespace) -> dict[str, Any]:
    """One comparison row, in this process: step time, peak memory, final loss."""
    import contextlib

    from accelerando.state import reset_runtime

    reset_runtime()
    acc = _through_accelerando(backend, recipe, compile=args.compile)
    device = acc.device
    dims = _dims(args)
    batches = _batches(dims, args.steps, device)
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    with device:  # built where it runs: a 1 B model initialised on the CPU takes seconds
        model = _model(dims)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt = acc.prepare(model, opt)
    losses, times = _steps(model, opt, acc.backward, contextlib.nullcontext, batches, device)
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) / 2**20
    else:
        peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base_rss) / 1024  # growth, MiB
    del model, opt
    _release(device)
    reset_runtime()
    return {
        "step_ms": 1000 * statistics.median(times[args.warmup :]),
        "first_s": times[0],
        "peak_mib": peak,
        "final_loss": statistics.fmean(losses[-3:]),
        "first_loss": losses[0],
        "device": str(device),
        "params": params,
    }


def _release(device: torch.device) -> None:
    """Free a row's model, optimizer and compiled graphs before the next row runs in this process."""
    import gc

    gc.collect()
    torch._dynamo.reset()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _why_not(backend: str, device_type: str) -> str | None:
    from accelerando.precision.fp8_probe import gather_facts, missing

    lacks = missing(backend, gather_facts(device_type, (backend,)))
    return ("needs " + " and ".join(lacks)) if lacks else None


PRESETS: dict[str, dict[str, Any]] = {
    # tiny and few steps, every row in this process: seconds on a CPU
    "smoke": {"dim": 64, "depth": 1, "heads": 4, "seq": 16, "batch": 2, "steps": 3, "warmup": 1},
    # 20 blocks of dim 2048 (12 * 2048^2 weights each) = 1.007 B parameters; 4 x 1024 tokens a step
    "gpu": {
        "dim": 2048, "depth": 20, "heads": 16, "seq": 1024, "batch": 4, "steps": 200, "warmup": 20,
        "compile": True, "rows": ["bf16", "torchao tensorwise", "Transformer Engine"],
    },
}  # fmt: skip
CHECK_DIMS = {"dim": 64, "depth": 2, "heads": 4, "seq": 16, "batch": 4}  # the integration check's model
CHECK_STEPS = 5


def _dims(args: argparse.Namespace) -> dict[str, int]:
    return {k: getattr(args, k) for k in ("dim", "depth", "heads", "seq", "batch")}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--smoke", action="store_true", help="tiny model, 3 steps, one process (CPU: seconds)"
    )
    parser.add_argument(
        "--gpu", action="store_true", help="the H100/H200 run: ~1 B params, 200 steps, compiled"
    )
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq", type=int, default=16)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--compile", action="store_true", help="torch.compile (inductor, regional) every row")
    parser.add_argument(
        "--rows", nargs="+", choices=[label for label, _, _ in ROWS], help="rows to run (default: all)"
    )
    parser.add_argument("--markdown", help="also write the table to this file")
    parser.add_argument("--row", type=int, help=argparse.SUPPRESS)  # internal: measure one row
    args = parser.parse_args(argv)
    if args.smoke and args.gpu:
        parser.error("--smoke and --gpu are two different runs; pick one")
    preset = PRESETS["smoke"] if args.smoke else PRESETS["gpu"] if args.gpu else {}
    given = {
        a.split("=")[0].lstrip("-")
        for a in (argv if argv is not None else sys.argv[1:])
        if a.startswith("--")
    }
    for key, value in preset.items():
        if key not in given:  # a flag given with the preset wins
            setattr(args, key, value)
    if args.warmup >= args.steps:
        parser.error(
            f"--warmup {args.warmup} must be below --steps {args.steps} (the median is taken after it)"
        )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.row is not None:
        label, backend, recipe = ROWS[args.row]
        print(json.dumps(measure(backend, recipe, args)))
        return 0
    device_type = _device().type
    check_dims = _dims(args) if args.smoke else CHECK_DIMS
    check_steps = args.steps if args.smoke else CHECK_STEPS
    results: list[tuple[str, str, dict[str, Any] | None, str]] = []
    for index, (label, backend, recipe) in enumerate(ROWS):
        if args.rows and label not in args.rows:
            continue
        reason = _why_not(backend, device_type) if backend else None
        if reason:
            results.append((label, "skipped", None, reason))
            continue
        check = integration(backend, recipe, check_dims, check_steps) if backend else "(baseline)"
        if args.smoke or device_type == "cuda":  # in this process: no start-up per row (CUDA resets its peak)
            try:
                results.append((label, check, measure(backend, recipe, args), ""))
            except Exception as err:  # noqa: BLE001 - one row failing (out of memory, a compile error) is a row
                _release(_device())
                results.append((label, check, None, f"failed: {type(err).__name__}: {str(err)[:300]}"))
            continue
        proc = subprocess.run(
            [sys.executable, str(Path(__file__)), "--row", str(index), *(argv if argv is not None else sys.argv[1:])],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if proc.returncode:
            results.append((label, check, None, "failed: " + proc.stderr.strip().splitlines()[-1][:300]))
            print(proc.stderr[-4000:], file=sys.stderr)
            continue
        results.append((label, check, json.loads(proc.stdout.strip().splitlines()[-1]), ""))
    table = _table(results, args)
    print(table)
    if args.markdown:
        Path(args.markdown).write_text(table + "\n")
    failed = [
        label
        for label, check, r, reason in results
        if check.startswith("DIFFERS") or reason.startswith("failed")
    ]
    return 1 if failed else 0


def _table(results: list[tuple[str, str, dict[str, Any] | None, str]], args: argparse.Namespace) -> str:
    base = next((r for label, _, r, _ in results if label == "bf16"), None)
    measured = next((r for _, _, r, _ in results if r is not None), None)
    lines = []
    if measured is not None:
        lines.append(
            f"fp8 suite on {measured['device']}: {measured['params'] / 1e6:.2f} M params (dim {args.dim}, "
            f"depth {args.depth}, seq {args.seq}, batch {args.batch}), {args.steps} AdamW steps"
            f"{', compiled (inductor, regional)' if args.compile else ''}, median step after {args.warmup} warm-up; "
            f"by hand vs accelerando on {'this model' if args.smoke else 'a small model'}"
        )
        if measured["device"] == "cpu":
            lines.append(
                "CPU: fp8 is emulated and bf16 has no fast kernels here; the timings say nothing about speed"
            )
    lines += [
        "",
        "| row | by hand vs accelerando | step ms | speed vs bf16 | peak MiB | first step s | final loss | loss vs bf16 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, check, r, reason in results:
        if r is None:
            lines.append(f"| {label} | {check}: {reason} | | | | | | |")
            continue
        speed = f"{base['step_ms'] / r['step_ms']:.2f}x" if base else ""
        gap = f"{100 * (r['final_loss'] / base['final_loss'] - 1):+.2f}%" if base else ""
        lines.append(
            f"| {label} | {check} | {r['step_ms']:.1f} | {speed} | {r['peak_mib']:.0f} | {r['first_s']:.1f} "
            f"| {r['final_loss']:.4f} | {gap} |"
        )
    fp8 = next((r for label, _, r, _ in results if label == "torchao tensorwise"), None)
    if base is not None and fp8 is not None and args.steps >= 200:
        speed, gap = base["step_ms"] / fp8["step_ms"], abs(fp8["final_loss"] / base["final_loss"] - 1)
        met = "met" if speed >= 1.3 and gap <= 0.01 else "NOT met"
        lines.append(
            f"\ntarget (torchao tensorwise >= 1.3x bf16 throughput, final loss within 1% after 200 steps): "
            f"{speed:.2f}x, {100 * gap:.2f}% -> {met}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
