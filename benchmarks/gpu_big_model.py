"""Big-model time-to-ready on the accelerator, and offloaded forwards, side by side with plain PyTorch,
Accelerate and transformers' own loader, on the same files.

Builds a random-init Llama with transformers (full: hidden 2560, 32 layers, intermediate 6912,
vocab 32000, about 2.7 B parameters, bf16, 5.4 GB in 2 GB safetensors shards), written once to a
temporary folder (page cache warm afterwards). Then each contender runs in fresh processes (best of
`--repeats` for the load times), each process doing, untimed imports and device start-up first:
  * time-to-ready, everything on the device: plain = meta init + safetensors `load_file(device=...)`
    + `load_state_dict(assign=True)`; Accelerate and accelerando = `init_empty_weights` +
    `load_checkpoint_and_dispatch(device_map="auto")`; transformers = `from_pretrained(device_map=<device>)`;
  * the median forward of that model (batch 4 x 2048 tokens; `--small`: 2 x 32);
  * time-to-ready and median forward with a device+cpu+disk map (planned once with `max_memory` by
    `infer_auto_device_map`, the same dict for every contender; disk weights in an offload folder).

    python benchmarks/gpu_big_model.py --json out.json            # the GPU run (~2-3 minutes on an H200)
    python benchmarks/gpu_big_model.py --json out.json --small --cpu   # seconds, no accelerator

Writes JSON rows {"case", "plain", "accelerate", "accelerando", "transformers", "unit": "s"} (None where
a contender does not apply or is not installed) and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

FULL = {"vocab_size": 32000, "hidden_size": 2560, "intermediate_size": 6912, "num_hidden_layers": 32,
        "num_attention_heads": 20, "num_key_value_heads": 20}  # fmt: skip
SMALL = {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 6,
         "num_attention_heads": 4, "num_key_value_heads": 2}  # fmt: skip
LIBS = ("plain", "accelerate", "accelerando", "transformers")
BLOCK = "LlamaDecoderLayer"


def llama_config(small: bool) -> Any:
    import transformers

    sizes = SMALL if small else FULL
    return transformers.LlamaConfig(**sizes, max_position_embeddings=4096, tie_word_embeddings=False)


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Parameters built in bf16 (buffers that ask for float32, like rotary frequencies, stay float32)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def meta_model(config: Any) -> Any:
    import transformers

    with default_dtype(torch.bfloat16), torch.device("meta"):
        return transformers.LlamaForCausalLM(config)


# --- the checkpoint (parent process) --------------------------------------------------------------


def write_checkpoint(folder: Path, small: bool) -> int:
    """Random bf16 weights (norms 1), std 0.02, drawn in parallel; saved sharded once. Returns params."""
    from huggingface_hub import save_torch_state_dict

    config = llama_config(small)
    shapes = {k: v.shape for k, v in meta_model(config).state_dict().items()}

    def draw(item: tuple[int, tuple[str, torch.Size]]) -> tuple[str, torch.Tensor]:
        index, (name, shape) = item
        if "norm" in name:
            return name, torch.ones(shape, dtype=torch.bfloat16)
        gen = torch.Generator().manual_seed(index)
        return name, (torch.randn(shape, generator=gen) * 0.02).to(torch.bfloat16)

    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        state = dict(pool.map(draw, enumerate(shapes.items())))
    folder.mkdir(parents=True, exist_ok=True)
    save_torch_state_dict(state, folder, max_shard_size="2GB" if not small else "200KB")
    config.save_pretrained(folder)
    return sum(t.numel() for t in state.values())


def offload_plan(folder: Path, device: str, off_layers: int) -> dict[str, Any]:
    """A device+cpu+disk map from `max_memory`: the last `off_layers` layers, the norm and the head leave the device."""
    import transformers

    from accelerando.big_modeling import infer_auto_device_map
    from accelerando.utils.modeling import compute_module_sizes

    model = meta_model(transformers.LlamaConfig.from_pretrained(folder))
    sizes = compute_module_sizes(model)
    layer, layers = sizes["model.layers.0"], model.config.num_hidden_layers
    resident = (
        sizes["model.embed_tokens"] + (layers - off_layers) * layer + layer + layer // 2
    )  # + room to run one
    if device == "cpu":
        budget: dict[Any, int] = {"cpu": resident}
    else:
        budget = {0: resident, "cpu": (off_layers // 2 + 1) * layer + layer // 2}  # + room to run one
    return dict(infer_auto_device_map(model, max_memory=budget, no_split_module_classes=[BLOCK]))


# --- one contender in a fresh process --------------------------------------------------------------


def synchronize(device: str) -> None:
    if device != "cpu":
        torch.accelerator.synchronize()


def load(lib: str, folder: Path, device: str, device_map: Any, offload: Path | None) -> Any:
    """One contender's model, ready on `device` (every copy landed)."""
    import transformers

    config = transformers.LlamaConfig.from_pretrained(folder)
    if lib == "transformers":
        return transformers.LlamaForCausalLM.from_pretrained(
            folder, device_map=device if device_map == "auto" else device_map, dtype=torch.bfloat16,
            offload_folder=offload,
        )  # fmt: skip
    if lib == "plain":
        from safetensors.torch import load_file

        model = meta_model(config)
        for shard in sorted(folder.glob("*.safetensors")):
            model.load_state_dict(load_file(shard, device=device), strict=False, assign=True)
        return model
    module: Any = importlib.import_module("accelerate" if lib == "accelerate" else "accelerando.big_modeling")
    with default_dtype(torch.bfloat16), module.init_empty_weights():
        model = transformers.LlamaForCausalLM(config)
    return module.load_checkpoint_and_dispatch(
        model, str(folder), device_map=device_map, no_split_module_classes=[BLOCK], dtype=torch.bfloat16,
        offload_folder=None if offload is None else str(offload),
    )  # fmt: skip


def timed(fn: Callable[[], Any], device: str) -> tuple[float, Any]:
    synchronize(device)
    start = time.perf_counter()
    result = fn()
    synchronize(device)
    return time.perf_counter() - start, result


@torch.no_grad()
def forward_time(model: Any, ids: torch.Tensor, device: str, repeats: int) -> tuple[float, torch.Tensor]:
    out = model(ids, use_cache=False).logits  # warm-up: kernels chosen, pages mapped, first prefetch
    model(ids, use_cache=False)
    times = [timed(lambda: model(ids, use_cache=False), device)[0] for _ in range(repeats)]
    return statistics.median(times), out


def fingerprint(model: Any) -> float:
    """A float64 sum over every loaded weight, to check the contenders loaded the same bits."""
    with torch.no_grad():
        return float(sum(p.double().sum().item() for p in model.parameters() if p.device.type != "meta"))


def free(device: str) -> None:
    """Drop a loaded model's memory, so the next load starts from an empty allocator cache."""
    gc.collect()
    if device != "cpu" and hasattr(torch.accelerator, "empty_cache"):
        torch.accelerator.empty_cache()


def warm_imports(lib: str) -> None:
    """Import what `load` needs before the clock starts (transformers' model modules load lazily)."""
    import safetensors.torch
    import transformers

    _ = transformers.LlamaForCausalLM, transformers.LlamaConfig, safetensors.torch.load_file
    importlib.import_module(
        {"accelerate": "accelerate", "accelerando": "accelerando.big_modeling"}.get(lib, "json")
    )


def contender(lib: str, args: argparse.Namespace, ids: torch.Tensor) -> dict[str, Any]:
    """One contender's load times (and forwards, with `--forward`); both maps, one after the other."""
    device, folder = args.device, args.dir
    warm_imports(lib)
    found: dict[str, Any] = {}
    found["ready"], model = timed(lambda: load(lib, folder, device, "auto", None), device)
    found["fingerprint"] = fingerprint(model)
    if args.forward and lib != "plain":
        found["forward"], expected = forward_time(model, ids, device, args.forward)
    del model
    free(device)
    if lib == "plain":
        return found
    offload = folder.parent / f"offload-{lib}-{os.getpid()}"
    try:
        plan = json.loads(args.plan)
        found["ready_offload"], model = timed(lambda: load(lib, folder, device, plan, offload), device)
        if args.forward:
            found["forward_offload"], out = forward_time(model, ids, device, args.forward)
            found["offload_exact"] = bool(torch.equal(out, expected))
    finally:
        shutil.rmtree(offload, ignore_errors=True)
    del model
    free(device)
    return found


def worker(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The contenders named in `--worker` (comma-separated), in this fresh process: {lib: results}."""
    if args.device != "cpu":
        torch.empty(1, device=args.device)  # device start-up is not loading
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=torch.Generator().manual_seed(1))
    return {lib: contender(lib, args, ids.to(args.device)) for lib in args.worker.split(",")}


def run_worker(
    libs: list[str], folder: Path, device: str, plan: dict, shape: tuple[int, int], forward: int
) -> dict[str, dict]:
    """Run contenders in a fresh interpreter; {} for each (and the error on stderr) if it failed."""
    cmd = [sys.executable, __file__, "--worker", ",".join(libs), "--dir", str(folder), "--device", device,
           "--plan", json.dumps(plan), "--batch", str(shape[0]), "--seq", str(shape[1]), "--forward", str(forward),
           "--vocab", str(llama_vocab(folder))]  # fmt: skip
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        print(f"[{', '.join(libs)}] failed:\n{proc.stderr[-3000:]}", file=sys.stderr)
        return {lib: {} for lib in libs}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def llama_vocab(folder: Path) -> int:
    return int(json.loads((folder / "config.json").read_text())["vocab_size"])


# --- the parent: contenders, rows, table -----------------------------------------------------------


def available(lib: str) -> bool:
    return lib != "accelerate" or importlib.util.find_spec("accelerate") is not None


def measure(
    folder: Path, device: str, plan: dict, shape: tuple[int, int], repeats: int, forwards: int, fresh: bool
) -> dict[str, list[dict]]:
    """{lib: [result per round]}; rounds interleave the contenders; the first round also times forwards.

    `fresh`: one new process per contender and round (the measurement). Otherwise all contenders
    share one process (the --small smoke run, where starting interpreters is most of the time).
    """
    libs = [lib for lib in LIBS if available(lib)]
    results: dict[str, list[dict]] = {lib: [] for lib in libs}
    for round_ in range(repeats):
        count = forwards if round_ == 0 else 0
        groups = [[lib] for lib in libs] if fresh else [libs]
        for group in groups:
            for lib, found in run_worker(group, folder, device, plan, shape, count).items():
                results[lib].append(found)
    return results


def best(results: dict[str, list[dict]], lib: str, key: str) -> float | None:
    values = [r[key] for r in results.get(lib, []) if key in r]
    return min(values) if values else None


def rows_of(results: dict[str, list[dict]], device: str, plan: dict, shape: tuple[int, int]) -> list[dict]:
    placed = [v for k, v in plan.items() if k.startswith("model.layers.")]
    off = sum(1 for v in placed if v in ("disk", "cpu") and not (v == "cpu" and device == "cpu"))
    disk = placed.count("disk")
    where = "cpu+disk" if device == "cpu" else f"{device}+cpu+disk"
    offloaded = f"{where} map ({off}/{len(placed)} layers off {device}, {disk} on disk; head on {plan.get('lm_head')})"
    tokens = f"{shape[0]}x{shape[1]} tokens"
    cases = [
        (f"time-to-ready, all on {device}", "ready", True),
        (f"time-to-ready, {offloaded}", "ready_offload", False),
        (f"forward, all on {device}, {tokens}", "forward", False),
        (f"forward, {offloaded}, {tokens}", "forward_offload", False),
    ]
    rows = []
    for case, key, with_plain in cases:
        row: dict[str, Any] = {"case": case}
        for lib in LIBS:
            row[lib] = best(results, lib, key) if (lib != "plain" or with_plain) else None
        rows.append(row | {"unit": "s"})
    return rows


def check(results: dict[str, list[dict]]) -> list[str]:
    """Notes on correctness: same weights as plain; offloaded logits equal the all-on-device ones."""
    notes = []
    reference = best(results, "plain", "fingerprint")
    for lib, runs in results.items():
        prints = {r["fingerprint"] for r in runs if "fingerprint" in r}
        if reference is not None and prints and prints != {reference}:
            notes.append(f"{lib}: loaded weights differ from plain ({prints} vs {reference})")
        exact = [r["offload_exact"] for r in runs if "offload_exact" in r]
        if exact:
            notes.append(
                f"{lib}: offloaded logits {'equal' if all(exact) else 'DIFFER from'} the all-on-device logits"
            )
    return notes


def table(rows: list[dict]) -> str:
    def cell(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f} s"

    lines = ["| case | plain | Accelerate | accelerando | transformers | accelerando / transformers |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for row in rows:
        ours, theirs = row["accelerando"], row["transformers"]
        ratio = f"{ours / theirs:.2f}x" if ours and theirs else "-"
        lines.append(f"| {row['case']} | " + " | ".join(cell(row[lib]) for lib in LIBS) + f" | {ratio} |")
    device_row, offload_row = rows[2], rows[3]
    for lib in ("accelerate", "accelerando", "transformers"):
        if device_row[lib] and offload_row[lib]:
            lines.append(
                f"\n{lib}: offloaded forward / all-on-device forward = {offload_row[lib] / device_row[lib]:.2f}x"
            )
    return "\n".join(lines)


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--small", action="store_true", help="a tiny Llama (seconds)")
    parser.add_argument(
        "--cpu", action="store_true", help="measure on the CPU even if an accelerator is present"
    )
    parser.add_argument(
        "--dir", type=Path, help="checkpoint folder (reused if it holds one; default: temporary)"
    )
    parser.add_argument(
        "--repeats", type=int, help="fresh processes per contender (default 2; 1 with --small)"
    )
    parser.add_argument(
        "--off-layers", type=int, help="layers planned off the device (default 6; 3 with --small)"
    )
    for hidden in ("--worker", "--device", "--plan"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    for hidden in ("--batch", "--seq", "--forward", "--vocab"):
        parser.add_argument(hidden, type=int, default=0, help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> None:
    args = parse()
    if args.worker:
        print(json.dumps(worker(args)))
        return
    accelerator = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    device = "cpu" if args.cpu or accelerator is None else f"{accelerator.type}:0"
    shape = (2, 32) if args.small else (4, 2048)
    repeats = args.repeats or (1 if args.small else 2)
    folder = args.dir or Path(tempfile.mkdtemp(prefix="accelerando-gpu-bigmodel-")) / "ckpt"
    try:
        if not (folder / "config.json").exists():
            start = time.perf_counter()
            params = write_checkpoint(folder, args.small)
            print(
                f"wrote {params / 1e9:.2f} B params (bf16) in {time.perf_counter() - start:.1f} s to {folder}"
            )
        plan = offload_plan(folder, device, args.off_layers or (3 if args.small else 6))
        results = measure(folder, device, plan, shape, repeats, 3 if args.small else 5, fresh=not args.small)
    finally:
        if args.dir is None:
            shutil.rmtree(folder.parent, ignore_errors=True)
    rows = rows_of(results, device, plan, shape)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    how = "all contenders in one process (a smoke run)" if args.small else "page cache warm"
    print(f"\nLlama {'small' if args.small else '2.7 B'}, bf16, {device}, torch {torch.__version__}; load times best of "
          f"{repeats} fresh processes, forwards median of {3 if args.small else 5}; {how}")  # fmt: skip
    print(table(rows))
    for note in check(results):
        print(f"- {note}")


if __name__ == "__main__":
    main()
