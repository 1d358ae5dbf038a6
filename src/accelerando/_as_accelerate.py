"""The opt-in switch that makes `import accelerate` (and `accelerate.X.Y`) give accelerando's modules.

`as_accelerate()` puts one finder first on `sys.meta_path`. For a module name `accelerate[.X.Y]` it
hands the import system a loader whose module *is* `accelerando[.X.Y]`, already imported or imported
then, so both names share one module object (`mock.patch` on either path patches the code that
runs). The same finder answers `importlib.metadata` for the distribution `accelerate` with the
Accelerate version this accelerando is compatible with, so version checks in transformers, peft and
others pass. Nothing happens without the switch; with it, one INFO log line says so.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import logging
import os
import re
import sys
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import Any

ACCELERATE_VERSION = "1.16.0"
"""The Accelerate release whose public API accelerando follows; what `version("accelerate")` answers."""

ALIAS = "accelerate"
TARGET = "accelerando"
logger = logging.getLogger(__name__)


def _target_name(fullname: str) -> str | None:
    """`accelerate.X.Y` -> `accelerando.X.Y`; None for names outside `accelerate`."""
    if fullname == ALIAS:
        return TARGET
    if fullname.startswith(ALIAS + "."):
        return TARGET + fullname[len(ALIAS) :]
    return None


class _AliasLoader(importlib.abc.Loader):
    """Loads `accelerate.X` as the module object `accelerando.X` (never a copy)."""

    def __init__(self, target: str) -> None:
        self.target = target
        self._own_spec: Any = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.target)
        self._own_spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The import system stamped the alias spec on the shared module; give it its own back.
        if self._own_spec is not None:
            module.__spec__ = self._own_spec


class _AccelerateDistribution(importlib.metadata.Distribution):
    """Metadata of the `accelerate` distribution as served by accelerando."""

    def read_text(self, filename: str) -> str | None:
        if filename in ("METADATA", "PKG-INFO"):
            from accelerando import __version__

            return (
                "Metadata-Version: 2.1\n"
                f"Name: {ALIAS}\n"
                f"Version: {ACCELERATE_VERSION}\n"
                f"Summary: Accelerate's API served by accelerando {__version__} (accelerando.as_accelerate())\n"
            )
        if filename == "top_level.txt":
            return ALIAS + "\n"
        if filename == "entry_points.txt":  # `accelerate` names accelerando's command line
            return "[console_scripts]\naccelerate = accelerando.commands.accelerate_cli:main\n"
        return None

    def locate_file(self, path: str | os.PathLike[str]) -> Any:
        import pathlib

        return pathlib.Path(__file__).parent / path


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


class AccelerateAliasFinder(importlib.metadata.DistributionFinder):
    """Meta path finder for `accelerate[.X.Y]` and distribution finder for `accelerate`."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        name = _target_name(fullname)
        if name is None:
            return None
        try:
            real = importlib.util.find_spec(name)
        except ModuleNotFoundError:
            real = None
        if real is None:
            raise ModuleNotFoundError(
                f"No module named {fullname!r}: `import accelerate` is served by accelerando "
                f"(accelerando.as_accelerate()), which has no module {name!r}",
                name=fullname,
            )
        return importlib.machinery.ModuleSpec(
            fullname,
            _AliasLoader(name),
            is_package=real.submodule_search_locations is not None,
        )

    def find_distributions(
        self, context: importlib.metadata.DistributionFinder.Context | None = None
    ) -> Iterator[importlib.metadata.Distribution]:
        name = None if context is None else context.name
        if name is None or _normalized(name) == ALIAS:
            yield _AccelerateDistribution()


def is_active() -> bool:
    return any(isinstance(finder, AccelerateAliasFinder) for finder in sys.meta_path)


def _real_accelerate_modules() -> list[str]:
    """Names of `accelerate*` modules already imported that are not accelerando's."""
    found = []
    for name, module in list(sys.modules.items()):
        if _target_name(name) is None or module is None:
            continue
        if not getattr(module, "__name__", "").startswith(TARGET):
            found.append(name)
    return sorted(found)


def as_accelerate() -> None:
    """Make `import accelerate` and every `accelerate.X.Y` resolve to accelerando's modules.

    Call it before importing transformers, peft, trl or diffusers (they import `accelerate`). With
    the real `accelerate` installed the switch still wins; if part of it was already imported,
    this raises instead of mixing both. Calling it again does nothing.
    """
    if is_active():
        return
    already = _real_accelerate_modules()
    if already:
        shown = ", ".join(already[:5]) + (f" and {len(already) - 5} more" if len(already) > 5 else "")
        raise RuntimeError(
            f"accelerando.as_accelerate(): the real accelerate is already imported ({shown}); call "
            "accelerando.as_accelerate() first, before importing transformers, peft, trl, diffusers or "
            "accelerate (or set ACCELERANDO_AS_ACCELERATE=1 and import accelerando first)"
        )
    sys.meta_path.insert(0, AccelerateAliasFinder())
    importlib.invalidate_caches()
    logger.info(
        "accelerando.as_accelerate(): `import accelerate` now gives accelerando's modules "
        "(reported as accelerate %s)",
        ACCELERATE_VERSION,
    )
