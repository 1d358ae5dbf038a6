"""The release's sdist and wheel: built, checked, and a plain `pip install` of the wheel runs.

`python -m build` makes the sdist and then the wheel from it (so the sdist is complete), `twine
check` validates both, the real pip picks the candidate only with `--pre`, and the wheel installed
with no extras imports, prints its version in `accelerando env`, passes `accelerando test` on 2 CPU
processes (both through docker/healthcheck/healthcheck.sh, the Docker images' HEALTHCHECK) and
launches a 2-process job.

How this stays honest and fast: the wheel is built from a copy of the sources and installed with
pip, without dependencies, into a fresh virtual environment that does not see this one. Its
dependencies are then made visible with one `.pth` file pointing at a folder of links to exactly
the distributions `pip install accelerando` would bring: the wheel's own `Requires-Dist` without
extras, followed transitively through each dependency's metadata (torch and numpy included).
Nothing else is reachable, so pytest, transformers, accelerate, torchao and torchdata must be
missing there, and `pip check` in that venv proves the declared requirements are met.

Installing torch again instead (hundreds of MB to unpack, or a multi-GB CUDA download on a fresh
CI machine) would prove nothing more about accelerando's packaging and would not fit the time of
one test; reusing this environment's whole site-packages (`--system-site-packages` or a `.pth` to
it) would hide exactly the missing-dependency bugs this test is for.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(360)]
OPTIONAL = ("pytest", "transformers", "accelerate", "torchao", "torchdata", "rich", "deepspeed")


def sh(cmd: list[str], timeout: float = 120, **kw: object) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)  # type: ignore[call-overload]
    assert proc.returncode == 0, (
        f"{' '.join(map(str, cmd))} exited {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    )
    return proc  # type: ignore[no-any-return]


def build_release(out: Path) -> tuple[Path, Path]:
    """`python -m build` on a copy of the sources (so the checkout gets no build/ or egg-info)."""
    source = out / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    offline = importlib.util.find_spec("setuptools") is not None
    flags = ["--no-isolation"] if offline else []  # else build fetches the build backend into a venv
    sh([sys.executable, "-m", "build", *flags, "--outdir", str(out / "dist"), str(source)], timeout=180)
    (sdist,) = (out / "dist").glob("accelerando-*.tar.gz")
    (wheel,) = (out / "dist").glob("accelerando-*.whl")
    return sdist, wheel


def check_release_files(sdist: Path, wheel: Path) -> None:
    """Both files are named by the one version, and `twine check --strict` (metadata, README) is clean."""
    import accelerando

    version = accelerando.__version__
    assert sdist.name == f"accelerando-{version}.tar.gz" and wheel.name.startswith(f"accelerando-{version}-")
    proc = sh([sys.executable, "-m", "twine", "check", "--strict", str(sdist), str(wheel)])
    assert proc.stdout.count("PASSED") == 2, proc.stdout


def pip_picks(index: Path, *flags: str) -> str:
    """The accelerando version the real pip would install from `index` (a find-links folder)."""
    report = index.parent / "report.json"
    sh(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-deps", "--no-index",
         "--find-links", str(index), "--report", str(report), "--quiet", *flags, "accelerando"],
    )  # fmt: skip
    (chosen,) = json.loads(report.read_text())["install"]
    return str(chosen["metadata"]["version"])


def previous_release_wheel(folder: Path, version: str = "0.1.0") -> Path:
    """A metadata-only wheel standing for the last final release on the index (pip reads only its metadata)."""
    import zipfile

    info = f"accelerando-{version}.dist-info"
    files = {
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: accelerando\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{info}/RECORD": "",
    }
    path = folder / f"accelerando-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return path


def requirement_closure(wheel: Path) -> list[md.Distribution]:
    """The installed distributions `pip install <wheel>` would need: Requires-Dist without extras, transitively."""
    metadata = md.PathDistribution(_unpacked_metadata(wheel))
    todo: list[tuple[str, frozenset[str]]] = [(r, frozenset()) for r in metadata.requires or []]
    seen: dict[str, md.Distribution] = {}
    while todo:
        text, parent_extras = todo.pop()
        req = Requirement(text)
        env_extras = parent_extras or frozenset({""})
        if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in env_extras):
            continue
        name = canonicalize_name(req.name)
        dist = md.distribution(req.name)  # PackageNotFoundError: this environment lacks a dependency
        assert dist.version in req.specifier or not req.specifier, f"{req} but {dist.version} is installed"
        if name in seen and not req.extras:
            continue
        seen[name] = dist
        todo += [(r, frozenset(req.extras)) for r in dist.requires or []]
    return list(seen.values())


def _unpacked_metadata(wheel: Path) -> Path:
    import zipfile

    folder = wheel.parent / "meta"
    with zipfile.ZipFile(wheel) as zf:
        members = [m for m in zf.namelist() if m.split("/")[0].endswith(".dist-info")]
        zf.extractall(folder, members)
    (info,) = folder.glob("*.dist-info")
    return info


def link_distributions(dists: list[md.Distribution], folder: Path) -> None:
    """A folder of links to each distribution's top-level files (packages, modules, .libs, dist-info)."""
    folder.mkdir()
    for dist in dists:
        assert dist.files is not None, f"{dist.metadata['Name']} has no RECORD; cannot tell its files"
        for top in sorted({f.parts[0] for f in dist.files if f.parts[0] not in ("..", "__pycache__")}):
            target = Path(str(dist.locate_file(top)))
            if target.exists() and not (folder / top).exists():
                (folder / top).symlink_to(target)


def test_release_builds_checks_and_installed_wheel_runs_without_extras(tmp_path: Path) -> None:
    import accelerando

    start = time.monotonic()
    sdist, wheel = build_release(tmp_path)
    check_release_files(sdist, wheel)
    index = tmp_path / "index"
    index.mkdir()
    shutil.copy(wheel, index)
    previous_release_wheel(index)
    assert pip_picks(index) == "0.1.0"  # plain `pip install accelerando` keeps the final release
    assert pip_picks(index, "--pre") == accelerando.__version__
    built = time.monotonic() - start

    venv = tmp_path / "venv"
    sh([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "ACCELERANDO_", "ACCELERATE_"))}
    env.update(PYTHONNOUSERSITE="1", HF_HOME=str(tmp_path / "hf"), OMP_NUM_THREADS="1")
    pip = [sys.executable, "-m", "pip", "--python", str(python)]
    sh([*pip, "install", "--no-deps", "--no-index", str(wheel)], env=env)
    site = sh(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], env=env
    ).stdout.strip()
    link_distributions(requirement_closure(wheel), tmp_path / "deps")
    Path(site, "accelerando_test_deps.pth").write_text(str(tmp_path / "deps") + "\n")
    sh([*pip, "check"], env=env)

    probe = (
        "import importlib.util, json, accelerando, accelerando.launchers, accelerando.utils, accelerando.testing;"
        "import accelerando.commands.main;"
        f"print(json.dumps({{'file': accelerando.__file__, 'missing': [m for m in {OPTIONAL!r} "
        "if importlib.util.find_spec(m) is None]}))"
    )
    seen = json.loads(sh([str(python), "-c", probe], env=env, cwd=tmp_path).stdout)
    assert seen["file"].startswith(str(venv)), seen
    assert seen["missing"] == list(OPTIONAL), (
        f"importable in a no-extras install: {set(OPTIONAL) - set(seen['missing'])}"
    )

    # the Docker images' HEALTHCHECK, run against this install: `accelerando env`, then `accelerando test`
    # on 2 CPU processes (docker/healthcheck/cpu.yaml)
    on_path = {**env, "PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"}
    health = sh(["sh", str(ROOT / "docker" / "healthcheck" / "healthcheck.sh")], env=on_path, cwd=tmp_path)
    assert f"- accelerando version: {accelerando.__version__}\n" in health.stdout, health.stdout
    assert "checks passed on 2 process(es)" in health.stdout, health.stdout

    out = tmp_path / "demo"
    proc = sh(
        [str(venv / "bin" / "accelerando"), "launch", "--cpu", "--num_processes", "2",
         str(ROOT / "examples" / "demo_train.py"), "--output_dir", str(out), "--epochs", "1"],
        env=env, cwd=tmp_path, timeout=150,
    )  # fmt: skip
    assert "2 process(es) on cpu" in proc.stdout and "epoch 0: loss" in proc.stdout, proc.stdout
    assert (out / "model.safetensors").is_file()
    print(f"sdist+wheel build, twine, pip resolution: {built:.1f}s; with install, env, test, launch: "
          f"{time.monotonic() - start:.1f}s")  # fmt: skip
