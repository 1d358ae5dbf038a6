"""Big-model inference: time-to-ready and forward latency, accelerando vs plain PyTorch.

Writes a synthetic decoder checkpoint (sharded safetensors, fp32), then in one run measures:
  * time-to-ready fully in RAM: raw = `torch.device("meta")` init + safetensors `load_file` +
    `load_state_dict(assign=True)` per shard; accelerando = `init_empty_weights` +
    `load_checkpoint_and_dispatch(device_map={"": "cpu"})`;
  * time-to-ready with about half the layers on disk (`device_map="auto"`, `max_memory` = half);
  * forward latency of that disk-offloaded model against the raw in-RAM model;
  * the same through Hugging Face Accelerate when `import accelerate` works (it writes the
    offloaded weights to its own offload folder, deleted afterwards).
Medians over repeats, page cache warm (the files were just written/read), so "disk" measures the
serving overhead, not the drive.

    python benchmarks/big_model.py            # ~1.5 B parameters, ~6 GB on disk (deleted afterwards)
    python benchmarks/big_model.py --small    # a few MB, seconds
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import logging
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from accelerando.big_modeling import init_empty_weights, load_checkpoint_and_dispatch


@dataclass(frozen=True)
class Config:
    vocab: int
    dim: int
    layers: int
    heads: int

    def params(self) -> int:
        return 2 * self.vocab * self.dim + self.layers * (12 * self.dim**2 + 13 * self.dim) + 2 * self.dim


FULL = Config(vocab=32000, dim=2048, layers=28, heads=16)  # ~1.54 B parameters
SMALL = Config(vocab=1000, dim=128, layers=8, heads=4)


class Layer(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.norm1 = nn.LayerNorm(cfg.dim)
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim)
        self.proj = nn.Linear(cfg.dim, cfg.dim)
        self.norm2 = nn.LayerNorm(cfg.dim)
        self.up = nn.Linear(cfg.dim, 4 * cfg.dim)
        self.down = nn.Linear(4 * cfg.dim, cfg.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        att = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Decoder(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.dim)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.layers))
        self.norm = nn.LayerNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def write_checkpoint(cfg: Config, folder: Path, layers_per_shard: int = 4) -> None:
    """Random weights written shard by shard (never the whole model in memory) plus the index."""
    folder.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(0)
    with init_empty_weights():
        shapes = {k: v.shape for k, v in Decoder(cfg).state_dict().items()}
    groups: list[list[str]] = [[k for k in shapes if not k.startswith("layers.")]]
    for start in range(0, cfg.layers, layers_per_shard):
        ids = {str(i) for i in range(start, min(start + layers_per_shard, cfg.layers))}
        groups.append([k for k in shapes if k.startswith("layers.") and k.split(".")[1] in ids])
    weight_map: dict[str, str] = {}
    for n, names in enumerate(groups):
        file = f"model-{n + 1:05d}-of-{len(groups):05d}.safetensors"
        shard = {k: _init(k, shapes[k], gen) for k in names}
        save_file(shard, folder / file)
        weight_map.update(dict.fromkeys(names, file))
        del shard
    index = {"metadata": {"total_size": 4 * cfg.params()}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


def _init(name: str, shape: torch.Size, gen: torch.Generator) -> torch.Tensor:
    if name.endswith("bias"):
        return torch.zeros(shape)
    if "norm" in name:
        return torch.ones(shape)
    return torch.randn(shape, generator=gen) * 0.02


def raw_load(cfg: Config, folder: Path) -> nn.Module:
    """The baseline: meta init, then every shard memory-mapped and assigned."""
    with torch.device("meta"):
        model = Decoder(cfg)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    for file in dict.fromkeys(index["weight_map"].values()):
        model.load_state_dict(load_file(folder / file), strict=False, assign=True)
    return model.eval()


def ours_load(cfg: Config, folder: Path, max_memory: dict | None = None) -> nn.Module:
    with init_empty_weights():
        model = Decoder(cfg)
    device_map = {"": "cpu"} if max_memory is None else "auto"
    model = load_checkpoint_and_dispatch(model, folder, device_map=device_map, max_memory=max_memory,
                                         no_split_module_classes=["Layer"])  # fmt: skip
    return model.eval()


def timed(fn: Callable[[], object], repeats: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        result = None
        gc.collect()
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def _rotation(n: int, shift: int) -> list[int]:
    """0..n-1 starting at a different place each round, so no contender always runs first."""
    return [(i + shift) % n for i in range(n)]


def timed_interleaved(fns: list[Callable[[], nn.Module]], repeats: int) -> list[tuple[float, nn.Module]]:
    """Median time of each loader, run in turn so that machine load hits all of them alike."""
    times: list[list[float]] = [[] for _ in fns]
    results: list[nn.Module | None] = [None for _ in fns]
    for round_ in range(repeats):
        for i in _rotation(len(fns), round_):
            fn = fns[i]
            results[i] = None
            gc.collect()
            start = time.perf_counter()
            results[i] = fn()
            times[i].append(time.perf_counter() - start)
    return [(statistics.median(t), r) for t, r in zip(times, results)]  # type: ignore[misc]


@torch.no_grad()
def forward_times(
    models: list[nn.Module], ids: torch.Tensor, repeats: int
) -> list[tuple[float, torch.Tensor]]:
    """Median forward time of each model, runs interleaved so machine load hits all alike."""
    outs = [model(ids) for model in models]  # warm-up (pages the weights in)
    times: list[list[float]] = [[] for _ in models]
    for round_ in range(repeats):
        for i in _rotation(len(models), round_):
            model = models[i]
            start = time.perf_counter()
            model(ids)
            times[i].append(time.perf_counter() - start)
    return [(statistics.median(t), out) for t, out in zip(times, outs)]


def accelerate_load(cfg: Config, folder: Path, max_memory: dict | None = None) -> nn.Module | None:
    """The same through Hugging Face Accelerate, when it is importable (None otherwise)."""
    try:
        import accelerate
    except ImportError:
        return None
    logging.getLogger("accelerate").setLevel(logging.ERROR)
    with accelerate.init_empty_weights():
        model = Decoder(cfg)
    device_map = {"": "cpu"} if max_memory is None else "auto"
    offload = tempfile.mkdtemp(prefix="accelerate-offload-", dir=folder.parent)
    _OFFLOAD_DIRS.append(offload)
    model = accelerate.load_checkpoint_and_dispatch(
        model,
        str(folder),
        device_map=device_map,
        max_memory=max_memory,
        no_split_module_classes=["Layer"],
        offload_folder=offload,
    )
    return model.eval()


_OFFLOAD_DIRS: list[str] = []

Row = tuple[str, float, float, float | None, str]


def _forward_repeats(cfg: Config, repeats: int) -> int:
    """Millisecond forwards (--small) need many samples for a stable median; second-long ones do not."""
    return repeats if cfg == FULL else max(repeats, 30)


def run(cfg: Config, folder: Path, repeats: int) -> tuple[list[Row], int]:
    """Raw PyTorch against accelerando, in this process. Returns the rows and the layers on disk."""
    ids = torch.randint(0, cfg.vocab, (1, 16), generator=torch.Generator().manual_seed(1))
    for _ in range(2):  # warm the page cache and the code paths on every side
        raw_load(cfg, folder), ours_load(cfg, folder)
    half = {"cpu": 4 * cfg.params() // 2}
    loaders = [
        lambda: raw_load(cfg, folder),
        lambda: ours_load(cfg, folder),
        lambda: ours_load(cfg, folder, half),
    ]
    (raw_ready, raw_model), (ours_ready, ours_model), (disk_ready, disk_model) = timed_interleaved(
        loaders, 4 * repeats
    )
    results = forward_times([raw_model, ours_model, disk_model], ids, _forward_repeats(cfg, repeats))
    (raw_fwd, reference), (ours_fwd, out), (disk_fwd, disk_out) = results
    assert torch.equal(out, reference), "in-RAM output differs from the raw model"
    assert torch.equal(disk_out, reference), "disk-offloaded output differs from the raw model"
    on_disk = sum(1 for name, dev in disk_model.hf_device_map.items() if dev == "disk" and "layers." in name)  # type: ignore[union-attr]
    rows: list[Row] = [
        ("time-to-ready, in RAM", raw_ready, ours_ready, None, "<= 1.1x"),
        (f"time-to-ready, {on_disk}/{cfg.layers} layers on disk", raw_ready, disk_ready, None, "<= 2x"),
        ("forward, in RAM", raw_fwd, ours_fwd, None, "~1x"),
        (f"forward, {on_disk}/{cfg.layers} layers on disk", raw_fwd, disk_fwd, None, "<= 1.5x"),
    ]
    return rows, on_disk


def run_accelerate(cfg: Config, folder: Path, repeats: int) -> dict[str, float]:
    """Raw PyTorch against Accelerate, in a process of its own (its imports slow everything down)."""
    ids = torch.randint(0, cfg.vocab, (1, 16), generator=torch.Generator().manual_seed(1))
    half = {"cpu": 4 * cfg.params() // 2}
    raw_load(cfg, folder), accelerate_load(cfg, folder)
    loaders = [lambda: raw_load(cfg, folder), lambda: accelerate_load(cfg, folder)]
    (raw_ready, raw_model), (acc_ready, _) = timed_interleaved(loaders, 2 * repeats)  # type: ignore[list-item]
    acc_disk_ready, acc_disk = timed(lambda: accelerate_load(cfg, folder, half), repeats)
    (raw_fwd, reference), (acc_fwd, out) = forward_times(
        [raw_model, acc_disk], ids, _forward_repeats(cfg, repeats)
    )  # type: ignore[list-item]
    assert torch.allclose(out, reference), "Accelerate output differs from the raw model"
    return {
        "raw_ready": raw_ready,
        "ready": acc_ready,
        "disk_ready": acc_disk_ready,
        "raw_fwd": raw_fwd,
        "fwd": acc_fwd,
    }


def accelerate_rows(rows: list[Row], cfg: Config, folder: Path, repeats: int, small: bool) -> list[Row]:
    """Fill the Accelerate column (ratios against the raw run of that process) when it is installed."""
    if importlib.util.find_spec("accelerate") is None:
        return rows
    cmd = [sys.executable, __file__, "--accelerate-only", "--dir", str(folder), "--repeats", str(repeats)]
    proc = subprocess.run([*cmd, *(["--small"] if small else [])], capture_output=True, text=True, check=True)
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    ratios = [
        found["ready"] / found["raw_ready"],
        found["disk_ready"] / found["raw_ready"],
        None,
        found["fwd"] / found["raw_fwd"],
    ]
    return [
        (n, raw, ours, None if r is None else r * raw, t) for (n, raw, ours, _, t), r in zip(rows, ratios)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--small", action="store_true", help="a tiny model, for a quick check")
    parser.add_argument(
        "--dir", type=Path, default=None, help="where to write the checkpoint (default: a temp dir)"
    )
    parser.add_argument("--keep", action="store_true", help="keep (and reuse) the checkpoint")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--accelerate-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    cfg = SMALL if args.small else FULL
    if args.accelerate_only:
        try:
            print(json.dumps(run_accelerate(cfg, args.dir, args.repeats)))
        finally:
            for offload in _OFFLOAD_DIRS:
                shutil.rmtree(offload, ignore_errors=True)
        return
    folder = args.dir or Path(tempfile.mkdtemp(prefix="accelerando-bigmodel-"))
    try:
        if not (folder / "model.safetensors.index.json").exists():
            start = time.perf_counter()
            write_checkpoint(cfg, folder)
            print(
                f"wrote {cfg.params() / 1e9:.2f} B params (fp32) in {time.perf_counter() - start:.1f} s to {folder}"
            )
        rows, on_disk = run(cfg, folder, args.repeats)
        rows = accelerate_rows(rows, cfg, folder, args.repeats, args.small)
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    print(
        f"\n{cfg.params() / 1e9:.2f} B params, fp32, torch {torch.__version__}, {torch.get_num_threads()} threads; "
        f"{on_disk}/{cfg.layers} layers on disk in the offload rows; medians, page cache warm"
    )
    print("| measure | raw PyTorch | accelerando | ratio | target | Accelerate | ratio |")
    print("|---|---|---|---|---|---|---|")
    for name, raw, ours, acc, target in rows:
        acc_cols = f"{acc * 1e3:.1f} ms | {acc / raw:.2f}x" if acc is not None else "- | -"
        print(
            f"| {name} | {raw * 1e3:.1f} ms | {ours * 1e3:.1f} ms | {ours / raw:.2f}x | {target} | {acc_cols} |"
        )


if __name__ == "__main__":
    main()
