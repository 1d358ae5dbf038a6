"""Comparing installed library versions with a requirement (Accelerate's `utils.versions`)."""

from __future__ import annotations

import importlib.metadata

from packaging.version import Version, parse

from accelerando.utils.constants import STR_OPERATION_TO_FUNC

torch_version = parse(importlib.metadata.version("torch"))


def compare_versions(library_or_version: str | Version, operation: str, requirement_version: str) -> bool:
    """`compare_versions("torch", ">=", "2.4")`: an installed distribution's version (or a Version) against one."""
    if operation not in STR_OPERATION_TO_FUNC:
        raise ValueError(f"`operation` must be one of {list(STR_OPERATION_TO_FUNC)}, received {operation!r}")
    if isinstance(library_or_version, str):
        library_or_version = parse(importlib.metadata.version(library_or_version))
    return bool(STR_OPERATION_TO_FUNC[operation](library_or_version, parse(requirement_version)))


def is_torch_version(operation: str, version: str) -> bool:
    """The installed torch against `version`, e.g. `is_torch_version(">=", "2.6")`."""
    return compare_versions(torch_version, operation, version)
