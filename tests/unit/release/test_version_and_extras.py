"""The release's version (one source, PEP 440 pre-release) and the optional extras in pyproject.toml.

pip picks a version with `packaging`'s `SpecifierSet.filter`: plain `pip install` passes
`prereleases=None` (finals only, unless nothing final matches) and `--pre` passes `True`. The real
pip is run against the built wheel in tests/integration/test_wheel_install.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

import accelerando
from accelerando import _version

ROOT = Path(__file__).resolve().parents[3]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
FEATURE_EXTRAS = ("deepspeed", "fp8", "trackers", "transformers", "torchdata")


def test_version_has_one_source() -> None:
    assert accelerando.__version__ == _version.__version__
    project = PYPROJECT["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "accelerando._version.__version__"
    }
    # no other file under src/ spells a version assignment of its own
    spelled = [
        p
        for p in (ROOT / "src" / "accelerando").rglob("*.py")
        if re.search(r"^__version__\s*=", p.read_text(), re.M) and p.name != "_version.py"
    ]
    assert spelled == []


def test_version_is_a_canonical_release_candidate() -> None:
    version = Version(accelerando.__version__)
    assert str(version) == accelerando.__version__  # canonical PEP 440 spelling, as the wheel's name
    assert version.is_prerelease and version.pre is not None and version.pre[0] == "rc"
    assert version.release[0] >= 1 and not version.is_devrelease and version.local is None


def _pick(candidates: list[str], spec: str = "", pre: bool | None = None) -> str | None:
    found = [Version(v) for v in SpecifierSet(spec).filter(candidates, prereleases=pre)]
    return str(max(found)) if found else None


def test_pip_pre_picks_the_candidate_and_plain_resolution_keeps_the_final_release() -> None:
    rc = accelerando.__version__
    index = ["0.1.0", rc]  # what the index holds once the candidate is published
    assert _pick(index) == "0.1.0"  # `pip install accelerando`
    assert _pick(index, pre=True) == rc  # `pip install --pre accelerando`
    assert _pick(index, spec=f">={rc}") == rc  # naming a pre-release in the specifier admits it
    assert _pick(index, spec="<1") == "0.1.0"
    final = str(Version(rc).base_version)
    assert _pick([*index, final], pre=True) == final  # the final release supersedes the candidate


def _extras() -> dict[str, list[Requirement]]:
    groups = PYPROJECT["project"]["optional-dependencies"]
    return {name: [Requirement(r) for r in reqs] for name, reqs in groups.items()}


def test_feature_extras_exist_and_test_installs_every_one() -> None:
    extras = _extras()
    assert set(FEATURE_EXTRAS) | {"test", "docs", "rich"} <= set(extras)
    in_test = {canonicalize_name(r.name) for r in extras["test"]}
    for name in FEATURE_EXTRAS:
        missing = {canonicalize_name(r.name) for r in extras[name]} - in_test
        assert not missing, f"extra {name!r} needs {missing}, which CI's `.[test]` would not install"
    assert {"build", "twine", "setuptools"} <= in_test
    torch = [Requirement(r) for r in PYPROJECT["project"]["dependencies"] if r.startswith("torch")]
    assert [str(r) for r in torch] == ["torch>=2.6"]
    assert not any(canonicalize_name(r.name) == "torch" for reqs in extras.values() for r in reqs)
