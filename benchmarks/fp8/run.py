"""UNVERIFIED: this script has not yet completed a run (a CPU run with the defaults did not finish within
15 minutes on a loaded 2-core machine). FP8 suite: every fp8 backend present, (1) used by hand vs through accelerando, then (2) against BF16.

(1) Integration: the same small transformer, same seed and data, trained N steps with the backend's
    own API written by hand and through `Accelerator(mixed_precision="fp8")`; the losses and final
    weights must be equal (a mismatch is an accelerando bug and stops the run).
(2) Comparison: BF16 autocast and each fp8 backend/recipe trained the same N steps, each in its own
    process (so its peak memory is its own): median step time, peak memory, final loss.
A backend this machine cannot run gets a row that says why (the capability probe's reasons).

    python benchmarks/fp8/run.py                         # CPU here: seconds, small model
    python benchmarks/fp8/run.py --dim 2048 --depth 20 --seq 1024 --batch 8 --steps 200  # GPU, ~1 B params
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

ROWS = [  # (label, backend, torchao recipe)
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


def _model(args: argparse.Namespace) -> Transformer:
    torch.manual_seed(0)
    return Transformer(args.dim, args.depth, args.heads)


def _batches(args: argparse.Namespace, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A fixed teacher's outputs: a target the model can learn, the same for every row."""
    g = torch.Generator().manual_seed(1)
    teacher = nn.Linear(args.dim, args.dim)
    out = []
    for _ in range(args.steps):
        x = torch.randn(args.batch, args.seq, args.dim, generator=g)
        with torch.no_grad():
            out.append((x.to(device), torch.tanh(teacher(x)).to(device)))
    return out


# ---- each backend used by hand, with its own API only ----------------------------------------


def _by_hand(
    backend: str, recipe: str | None, model: nn.Module, device: torch.device
) -> tuple[Any, Any, Any]:
    """(model, optimizer, forward context) as a user of the backend writes it without accelerando."""
    import contextlib

    from accelerando.precision.fp8 import default_fp8_filter

    if backend == "ao":
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        config = Float8LinearConfig.from_recipe_name(recipe or "tensorwise")
        model = convert_to_float8_training(model, config=config, module_filter_fn=default_fp8_filter).to(
            device
        )
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3), contextlib.nullcontext
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
            lambda: te.fp8_autocast(enabled=True, fp8_recipe=fp8_recipe),
        )
    import msamp

    model = model.to(device)
    model, opt = msamp.initialize(model, torch.optim.AdamW(model.parameters(), lr=1e-3), opt_level="O2")
    return model, opt, contextlib.nullcontext


def _through_accelerando(backend: str | None, recipe: str | None) -> tuple[Any, Any, Any, Any]:
    from accelerando import Accelerator, AORecipeKwargs, MSAMPRecipeKwargs, TERecipeKwargs

    handler: Any = (
        {
            "ao": lambda: AORecipeKwargs(recipe_name=recipe),
            "te": TERecipeKwargs,
            "msamp": lambda: MSAMPRecipeKwargs(opt_level="O2"),
        }[backend]()
        if backend
        else None
    )
    acc = Accelerator(
        mixed_precision="fp8" if backend else "bf16", kwargs_handlers=[handler] if handler else None
    )
    return acc, handler, acc.backward, acc.device


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


def integration(backend: str, recipe: str | None, args: argparse.Namespace) -> str:
    """Same steps by hand and through accelerando: equal losses and weights, or an AssertionError."""
    import contextlib

    from accelerando.state import reset_runtime

    reset_runtime()
    acc, _, backward, device = _through_accelerando(backend, recipe)
    batches = _batches(args, device)
    model = _model(args)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt = acc.prepare(model, opt)
    ours, _ = _steps(model, opt, backward, contextlib.nullcontext, batches, device)
    theirs_model, theirs_opt, ctx = _by_hand(backend, recipe, _model(args), device)
    theirs, _ = _steps(theirs_model, theirs_opt, lambda loss: loss.backward(), ctx, batches, device)
    if ours != theirs:
        raise AssertionError(f"{backend}/{recipe}: losses differ by hand {theirs} vs accelerando {ours}")
    for (name, a), b in zip(acc.unwrap_model(model).state_dict().items(), theirs_model.state_dict().values()):
        if torch.is_tensor(a) and not torch.equal(a, b):
            raise AssertionError(f"{backend}/{recipe}: weight {name} differs after {args.steps} steps")
    reset_runtime()
    return "equal"


def measure(backend: str | None, recipe: str | None, args: argparse.Namespace) -> dict[str, Any]:
    """One comparison row, in this process: step time, peak memory, final loss."""
    import contextlib

    acc, _, backward, device = _through_accelerando(backend, recipe)
    batches = _batches(args, device)
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    model = _model(args)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt = acc.prepare(model, opt)
    losses, times = _steps(model, opt, backward, contextlib.nullcontext, batches, device)
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) / 2**20
    else:
        peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base_rss) / 1024  # growth, MiB
    return {
        "step_ms": 1000 * statistics.median(times[args.warmup :]),
        "peak_mib": peak,
        "final_loss": statistics.fmean(losses[-3:]),
        "first_loss": losses[0],
        "device": str(device),
        "params": sum(p.numel() for p in _model(args).parameters()),
    }


def _why_not(backend: str, device_type: str) -> str | None:
    from accelerando.precision.fp8_probe import gather_facts, missing

    lacks = missing(backend, gather_facts(device_type, (backend,)))
    return ("needs " + " and ".join(lacks)) if lacks else None


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--row", type=int, help=argparse.SUPPRESS)  # internal: measure one row
    args = parser.parse_args()
    if args.row is not None:
        label, backend, recipe = ROWS[args.row]
        print(json.dumps(measure(backend, recipe, args)))
        return
    device_type = _device().type
    results: list[tuple[str, str, dict[str, Any] | None, str]] = []
    for index, (label, backend, recipe) in enumerate(ROWS):
        reason = _why_not(backend, device_type) if backend else None
        if reason:
            results.append((label, "skipped", None, reason))
            continue
        check = integration(backend, recipe, args) if backend else "(baseline)"
        proc = subprocess.run(
            [sys.executable, str(Path(__file__)), "--row", str(index), *sys.argv[1:]],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if proc.returncode:
            raise SystemExit(f"row {label!r} failed:\n{proc.stderr[-4000:]}")
        results.append((label, check, json.loads(proc.stdout.strip().splitlines()[-1]), ""))
    print(_table(results, args))


def _table(results: list[tuple[str, str, dict[str, Any] | None, str]], args: argparse.Namespace) -> str:
    base = next(r for label, _, r, _ in results if label == "bf16")
    assert base is not None
    lines = [
        f"fp8 suite on {base['device']}: {base['params'] / 1e6:.2f} M params (dim {args.dim}, depth {args.depth}, "
        f"seq {args.seq}, batch {args.batch}), {args.steps} AdamW steps, median step after {args.warmup} warm-up",
        "",
        "| row | by hand vs accelerando | step ms | vs bf16 | peak MiB | final loss | loss vs bf16 |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, check, r, reason in results:
        if r is None:
            lines.append(f"| {label} | skipped: {reason} | | | | | |")
            continue
        lines.append(
            f"| {label} | {check} | {r['step_ms']:.1f} | {r['step_ms'] / base['step_ms']:.2f}x | {r['peak_mib']:.0f} "
            f"| {r['final_loss']:.4f} | {100 * (r['final_loss'] / base['final_loss'] - 1):+.1f}% |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
