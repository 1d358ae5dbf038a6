"""The Dockerfiles under docker/ without a Docker engine: what they copy exists and is sent, the health
check is wired the same way in every image, and its launch configs resolve for the launcher.

Each image is built with the repository root as its context (docs/release.md), filtered by the root
`.dockerignore`; the images themselves are built by the release job.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
from pathlib import Path

import pytest
import tomllib

from accelerando.config.yaml_config import load_config
from accelerando.launch.settings import Detected, resolve

ROOT = Path(__file__).resolve().parents[3]
TAGS = ("cpu", "gpu", "gpu-deepspeed", "gpu-fp8-transformerengine")
HEALTHCHECK = "/etc/accelerando/healthcheck.sh"


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined and comments dropped."""
    joined, current = [], ""
    for line in dockerfile.read_text().splitlines():
        if line.lstrip().startswith("#") and not current:
            continue
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        current += line
        if current.strip():
            joined.append(current.strip())
        current = ""
    return [(text.split(None, 1)[0].upper(), text.split(None, 1)[1]) for text in joined]


def copy_sources(args: str) -> list[str] | None:
    """The context paths a COPY/ADD reads; None for a copy from another stage or image (`--from`)."""
    words = shlex.split(args) if not args.lstrip().startswith("[") else json.loads(args)
    if any(w.startswith("--from") for w in words):
        return None
    paths = [w for w in words if not w.startswith("--")]
    return paths[:-1]


def ignored(path: str, patterns: list[str]) -> bool:
    """`.dockerignore` semantics for the patterns used here: last match wins, `!` re-includes, a
    pattern matching a folder covers everything under it."""
    parts = path.strip("/").split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    verdict = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        body = pattern[1:] if negate else pattern
        body = body.strip("/")
        if any(fnmatch.fnmatch(p, body) or fnmatch.fnmatch(p, body.replace("**/", "")) for p in prefixes):
            verdict = not negate
    return verdict


def dockerignore() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [s.strip() for s in lines if s.strip() and not s.lstrip().startswith("#")]


@pytest.mark.parametrize("tag", TAGS)
def test_every_copy_source_exists_in_the_context_and_is_sent(tag: str) -> None:
    dockerfile = ROOT / "docker" / tag / "Dockerfile"
    steps = instructions(dockerfile)
    assert steps[0][0] in ("ARG", "FROM"), steps[0]
    copies = [copy_sources(args) for kind, args in steps if kind in ("COPY", "ADD")]
    sources = [s for group in copies if group for s in group]
    assert sources, f"{dockerfile} copies nothing from its context"
    patterns = dockerignore()
    for source in sources:
        matches = list(ROOT.glob(source.rstrip("/"))) if any(c in source for c in "*?[") else [ROOT / source]
        assert matches and all(m.exists() for m in matches), f"{dockerfile}: COPY {source} names nothing"
        for match in matches:
            rel = match.relative_to(ROOT).as_posix()
            assert not ignored(rel, patterns), f"{dockerfile}: COPY {source}, but .dockerignore drops it"
            if match.is_dir():  # what the build needs inside a copied folder is sent too
                kept = [
                    f
                    for f in match.rglob("*")
                    if f.is_file() and not ignored(f.relative_to(ROOT).as_posix(), patterns)
                ]
                assert kept, f"{dockerfile}: .dockerignore empties {source}"


def test_dockerignore_keeps_the_checkout_out_of_the_context() -> None:
    patterns = dockerignore()
    for sent in ("pyproject.toml", "README.md", "src/accelerando/__init__.py", "docker/healthcheck/cpu.yaml"):
        assert not ignored(sent, patterns), sent
    for dropped in (
        ".git/HEAD",
        ".venv/bin/python",
        "tests/conftest.py",
        "src/accelerando/__pycache__/x.pyc",
    ):
        assert ignored(dropped, patterns), dropped


@pytest.mark.parametrize("tag", TAGS)
def test_image_pins_torch_installs_its_extras_and_checks_its_health(tag: str) -> None:
    steps = instructions(ROOT / "docker" / tag / "Dockerfile")
    text = "\n".join(f"{kind} {args}" for kind, args in steps)
    torch_pin = re.search(r"^ARG TORCH_VERSION=(\S+)$", text, re.M)
    make_pin = re.search(r"^TORCH_SPEC \?= torch==(\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert torch_pin and make_pin and torch_pin.group(1) == make_pin.group(1)
    assert '--index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"' in text
    extras_used = re.search(r'pip install --no-cache-dir "\./\[([a-z0-9,-]+)\]"', text)
    assert extras_used, "the image installs accelerando from the context with its extras"
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(extras_used.group(1).split(",")) <= set(extras)
    wanted = {"gpu-deepspeed": "deepspeed", "gpu-fp8-transformerengine": "fp8"}.get(tag)
    assert wanted is None or wanted in extras_used.group(1).split(",")
    (health,) = [args for kind, args in steps if kind == "HEALTHCHECK"]
    assert health.endswith(f'CMD ["{HEALTHCHECK}"]'), health
    assert any(
        kind == "COPY" and args.split() == ["docker/healthcheck/", "/etc/accelerando/"]
        for kind, args in steps
    )
    assert any(kind == "USER" and args.isdigit() for kind, args in steps), "runs as a numeric non-root user"
    base = next(args for kind, args in steps if kind == "FROM")
    assert ("python:" in base) if tag == "cpu" else base.startswith("nvidia/cuda:")


def test_health_check_script_runs_env_then_a_two_process_test() -> None:
    script = ROOT / "docker" / "healthcheck" / "healthcheck.sh"
    assert os.access(script, os.X_OK) and script.read_text().startswith("#!/bin/sh\n")
    lines = [s.strip() for s in script.read_text().splitlines()]
    assert "set -eu" in lines and "accelerando env" in lines
    assert lines[-1] == 'exec accelerando test --config_file "$config"'
    ds = (ROOT / "docker" / "gpu-deepspeed" / "Dockerfile").read_text()
    assert "DS_BUILD_CPU_ADAM=1" in ds and "ds_report" in ds and 'deepspeed==${DEEPSPEED_VERSION}"' in ds


@pytest.mark.parametrize(
    ("config", "gpus", "cpu"), [("cpu.yaml", 0, True), ("cpu.yaml", 1, True), ("gpu.yaml", 2, False)]
)
def test_health_check_configs_resolve_to_two_processes(config: str, gpus: int, cpu: bool) -> None:
    detected = Detected(device_type="cuda" if gpus else "cpu", device_count=gpus, cpu_cores=2)
    loaded = load_config(ROOT / "docker" / "healthcheck" / config)
    resolved = resolve({}, {}, loaded, detected)
    assert (resolved["num_processes"], bool(resolved["cpu"])) == (2, cpu)
