"""`accelerando estimate-memory`: training memory per process, per dtype and per strategy.

The model is built on the meta device (no weights are allocated or downloaded), from a local
transformers `config.json` (or its folder) or from `module:callable`. Per parameter, with Adam:
weights and gradients take the dtype's size; the optimizer keeps two fp32 moments, plus an fp32
master copy when the weights are in a lower precision (the ZeRO paper's accounting). Activations
are not included: they depend on batch size and sequence length.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accelerando.commands._args import add_flag

DTYPE_BYTES = {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0, "int8": 1.0, "int4": 0.5}
STRATEGIES = ("single", "DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3", "FSDP")


def estimate_command_parser(subparsers: argparse._SubParsersAction | None = None) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    """The `estimate-memory` parser (Accelerate's name): a sub-command when `subparsers` is given."""
    if subparsers is not None:
        parser = subparsers.add_parser(
            "estimate-memory", help="estimate training memory of a model built on meta"
        )
    else:
        parser = argparse.ArgumentParser(prog="accelerando estimate-memory")
    parser.add_argument(
        "model_name", help="path to a transformers config.json (or its folder), or module:callable"
    )
    add_flag(parser, "dtypes", nargs="+", default=["float32", "bfloat16"], choices=tuple(DTYPE_BYTES),
             help="weight dtypes to show")  # fmt: skip
    add_flag(parser, "num_processes", type=int, default=8, help="processes that share the work (default 8)")
    add_flag(parser, "library_name", choices=("transformers", "timm"), default=None,
             help="accepted for Accelerate's command lines; local configs are read with transformers")  # fmt: skip
    add_flag(parser, "trust_remote_code", action="store_true", help="accepted for Accelerate's command lines")
    parser.set_defaults(func=estimate_command)
    return parser


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    estimate_command_parser(sub)


@dataclass(frozen=True)
class ModelSize:
    name: str
    parameters: int
    largest_layer: int


@dataclass(frozen=True)
class Estimate:
    """Bytes per process for one dtype and strategy."""

    strategy: str
    weights: float
    gradients: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer


def build_on_meta(spec: str) -> Any:
    """A model whose parameters live on the meta device."""
    import torch

    path = Path(spec)
    with torch.device("meta"):
        if path.name == "config.json" or (path.is_dir() and (path / "config.json").is_file()):
            from transformers import AutoConfig, AutoModel

            config = AutoConfig.from_pretrained(str(path.parent if path.is_file() else path))
            return AutoModel.from_config(config)
        module_name, sep, attr = spec.partition(":")
        if not sep or not attr:
            raise ValueError(f"model {spec!r} is neither a config.json/folder nor 'module:callable'")
        if "" not in sys.path and str(Path.cwd()) not in sys.path:
            sys.path.insert(0, str(Path.cwd()))  # like `python -m`: modules of the current folder
        try:
            factory = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as err:
            raise ValueError(f"cannot load {spec!r}: {err}") from None
        return factory()


def create_empty_model(
    model_name: str,
    library_name: str | None = None,
    trust_remote_code: bool = False,
    access_token: str | None = None,
) -> Any:
    """Accelerate's name: the model on meta, from a local config / `module:callable` as the command
    reads it, else (a Hub name) from its transformers config or timm's architecture name. Hub
    names need network access or the Hugging Face cache: nothing is downloaded but the config."""
    local = ":" in model_name or Path(model_name).exists()
    if library_name not in (None, "transformers", "timm"):
        raise ValueError(f"library_name={library_name!r}: accepted are 'transformers', 'timm' or None")
    if local and library_name != "timm":
        return build_on_meta(model_name)
    import torch

    with torch.device("meta"):
        if library_name == "timm":
            import timm

            return timm.create_model(model_name, pretrained=False)
        from transformers import AutoConfig, AutoModel

        config = AutoConfig.from_pretrained(
            model_name, trust_remote_code=trust_remote_code, token=access_token
        )
        return AutoModel.from_config(config, torch_dtype=torch.float32, trust_remote_code=trust_remote_code)


def create_ascii_table(headers: list[str], rows: list[list[str]], title: str) -> str:
    """Accelerate's box-drawn table (title, centred header and cells), line for line the same: a
    title wider than the columns widens the last one by twice its excess over the rule, as there."""
    widths = [max(len(v) for v in [h, *(row[i] for row in rows)]) for i, h in enumerate(headers)]
    if len(title) > sum(widths):
        widths[-1] += 2 * abs(len(title) - (sum(widths) + len(widths) + 1))
    inner = sum(widths) + len(widths) - 1

    def rule(left: str, middle: str, right: str) -> str:
        return left + middle.join("\u2500" * w for w in widths) + right

    def line(cells: list[str]) -> str:
        return "\u2502" + "\u2502".join(c.center(w) for c, w in zip(cells, widths)) + "\u2502"

    out = [rule("\u250c", "\u2500", "\u2510"), "\u2502" + title.center(inner) + "\u2502"]
    out += [rule("\u251c", "\u252c", "\u2524"), line(headers), rule("\u251c", "\u253c", "\u2524")]
    out += [line(row) for row in rows] + [rule("\u2514", "\u2534", "\u2518")]
    return "\n".join(out)


def measure(model: Any, name: str) -> ModelSize:
    """Parameter count (shared tensors once) and the largest leaf module's parameter count."""
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    largest = max(
        (sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules()),
        default=0,
    )
    return ModelSize(name=name, parameters=total, largest_layer=largest)


def estimate(parameters: int, dtype: str, strategy: str, world: int) -> Estimate:
    """Per-process bytes for weights, gradients and Adam state under a sharding strategy."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy {strategy!r} is not one of {', '.join(STRATEGIES)}")
    if world < 1:
        raise ValueError(f"num_processes={world} must be at least 1")
    size = DTYPE_BYTES[dtype]
    optimizer_per_param = 8.0 + (4.0 if size < 4 else 0.0)
    w, g, o = parameters * size, parameters * size, parameters * optimizer_per_param
    n = 1 if strategy == "single" else world
    shards = {
        "single": (1, 1, 1),
        "DDP": (1, 1, 1),
        "ZeRO-1": (1, 1, n),
        "ZeRO-2": (1, n, n),
        "ZeRO-3": (n, n, n),
        "FSDP": (n, n, n),
    }[strategy]
    return Estimate(strategy, w / shards[0], g / shards[1], o / shards[2])


def human(nbytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if nbytes < 1024 or unit == "TiB":
            return f"{nbytes:.2f} {unit}"
        nbytes /= 1024
    return f"{nbytes:.2f} TiB"


def table(size: ModelSize, dtypes: list[str], world: int) -> str:
    header = ("dtype", "strategy", "weights", "gradients", "optimizer (Adam)", "total / process")
    rows = [header]
    for dtype in dtypes:
        for strategy in STRATEGIES:
            e = estimate(size.parameters, dtype, strategy, world)
            rows.append(
                (dtype, strategy, human(e.weights), human(e.gradients), human(e.optimizer), human(e.total))
            )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = [
        f"Memory for training {size.name}: {size.parameters:,} parameters, largest layer {size.largest_layer:,}; "
        f"per process with {world} processes (single: one process); activations not included",
    ]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    lines.append(rule)
    for i, row in enumerate(rows):
        lines.append("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |")
        if i == 0:
            lines.append(rule)
    lines.append(rule)
    return "\n".join(lines)


def gather_data(args: argparse.Namespace) -> list[list[Any]]:
    """Accelerate's rows: [dtype, largest layer bytes, total bytes, {model, optimizer, gradients, step}].

    The last entry is the whole-model training estimate on one process with Adam (bytes).
    """
    size = measure(build_on_meta(args.model_name), args.model_name)
    rows: list[list[Any]] = []
    for dtype in args.dtypes:
        e = estimate(size.parameters, dtype, "single", 1)
        training = {"model": e.weights, "optimizer": e.optimizer, "gradients": e.gradients, "step": e.total}
        rows.append(
            [dtype, size.largest_layer * DTYPE_BYTES[dtype], size.parameters * DTYPE_BYTES[dtype], training]
        )
    return rows


def estimate_command(args: argparse.Namespace) -> int:
    model = build_on_meta(args.model_name)
    print(table(measure(model, args.model_name), list(args.dtypes), args.num_processes))
    return 0


if __name__ == "__main__":
    sys.exit(estimate_command(estimate_command_parser().parse_args()))
