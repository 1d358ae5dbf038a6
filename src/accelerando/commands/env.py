"""`accelerando env`: versions, hardware and the launch config, ready to paste into a bug report."""

from __future__ import annotations

import argparse
import platform
import shutil
import sys
from typing import Any

from accelerando.commands._args import add_flag


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = sub.add_parser("env", help="print versions, hardware and config for a bug report")
    add_flag(parser, "config_file", default=None, help="config file to show (default: the per-user file)")
    parser.set_defaults(func=run)


def _version(module: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(module)
    except PackageNotFoundError:
        return "not installed"


def collect(config_file: str | None = None) -> dict[str, Any]:
    """The report as ordered key -> value pairs (the last one is the config mapping or a note)."""
    import psutil
    import torch

    from accelerando import __version__
    from accelerando.config.yaml_config import find_default_config, read_mapping
    from accelerando.devices.registry import accelerator_device

    device = accelerator_device()
    info: dict[str, Any] = {
        "accelerando version": __version__,  # the imported package's, even when several are installed
        "Platform": platform.platform(),
        "accelerando command": shutil.which("accelerando") or "not on PATH",
        "Python version": platform.python_version(),
        "Python executable": sys.executable,
        "NumPy version": _version("numpy"),
        "PyTorch version": f"{torch.__version__} ({'CUDA ' + torch.version.cuda if torch.version.cuda else 'CPU'})",
        "PyTorch accelerator": device.type.upper() if device.type != "cpu" else "N/A",
        "Device count": device.device_count() if device.type != "cpu" else 0,
        "CPU cores (physical/logical)": f"{psutil.cpu_count(logical=False)}/{psutil.cpu_count()}",
        "System RAM": f"{psutil.virtual_memory().total / 2**30:.2f} GiB",
    }
    for pkg in ("transformers", "deepspeed", "torchao", "torchdata", "safetensors", "huggingface_hub"):
        info[f"{pkg} version"] = _version(pkg)
    path = config_file or find_default_config()
    info["Config file"] = str(path) if path else "none (defaults)"
    info["Config"] = read_mapping(__import__("pathlib").Path(path)) if path else {}
    return info


def render(info: dict[str, Any]) -> str:
    lines = ["Copy-and-paste the text below in your GitHub issue", ""]
    for key, value in info.items():
        if key == "Config":
            lines.append("- Config:" + ("" if value else " -"))
            lines.extend(f"\t- {k}: {v}" for k, v in value.items())
        else:
            lines.append(f"- {key}: {value}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    print(render(collect(args.config_file)))
    return 0
