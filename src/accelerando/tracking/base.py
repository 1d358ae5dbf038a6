"""What every tracker is: Accelerate's `GeneralTracker` contract, the main-process guard, and the
lazy SDK import that names the pip package when it is missing."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging
from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeVar

from accelerando import _runtime

F = TypeVar("F", bound=Callable[..., Any])
logger = logging.getLogger("accelerando.tracking")


class TrackerError(RuntimeError):
    """A tracker failed; the message names it and the call (`start`, `log`, `finish`, ...)."""


def _is_main_process() -> bool:
    return _runtime.require_runtime().topology.rank == 0


def on_main_process(function: F) -> F:
    """Run a tracker method only on the main process when the tracker's `main_process_only` is true.

    The rank is read when the method is called, not when the class is defined, so trackers can be
    built before the process group exists.
    """

    @functools.wraps(function)
    def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, "main_process_only", False) and not _is_main_process():
            return None
        return function(self, *args, **kwargs)

    return guarded  # type: ignore[return-value]


class GeneralTracker:
    """Base of every tracker, built-in or yours.

    A subclass sets the class attributes `name` (what `log_with` and `get_tracker` use) and
    `requires_logging_directory`, and a `tracker` property returning the SDK's own run object;
    it overrides `start`, `store_init_configuration`, `log` and `finish` as its SDK needs.
    `main_process_only = False` makes the `Accelerator` start it and call it on every rank.
    """

    name: str
    requires_logging_directory: bool
    tracker: Any  # a property in subclasses: the SDK's run object
    main_process_only = True

    def __init__(self, _blank: bool = False) -> None:
        if _blank:
            return
        missing = [
            f"`{attr}`"
            for attr in ("name", "requires_logging_directory")
            if not hasattr(type(self), attr) and not hasattr(self, attr)
        ]
        if "tracker" not in dir(self):
            missing.append("`tracker`")
        if missing:
            raise NotImplementedError(
                f"tracker class {type(self).__name__} does not define {', '.join(missing)}; "
                "a GeneralTracker subclass needs `name`, `requires_logging_directory` and a `tracker` property"
            )

    def start(self) -> None:
        """Create the run (called by `init_trackers`, after the process group exists)."""

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Record the run's hyperparameters."""

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Record `values` at `step`."""

    def finish(self) -> None:
        """Flush and close the run."""


class InertRun:
    """What `get_tracker(name, unwrap=True)` returns where the tracker has no run (other ranks).

    Every attribute is this object again and calling it does nothing, so rank-independent code like
    `accelerator.get_tracker("wandb", unwrap=True).log_artifact(...)` is a no-op there instead of an
    AttributeError.
    """

    def __getattr__(self, name: str) -> InertRun:
        if name.startswith("__"):
            raise AttributeError(name)
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> InertRun:
        return self

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "InertRun()  # this rank has no run: the tracker runs on the main process only"


INERT_RUN = InertRun()


def import_sdk(module: str, tracker: str, pip_package: str) -> ModuleType:
    """Import a tracker's SDK on first use; a missing one is an ImportError that says what to install."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name is not None and module.split(".")[0] != err.name.split(".")[0]:
            raise  # the SDK is installed but one of its own dependencies is not: keep pip's story
        raise ImportError(
            f"the {tracker!r} tracker needs the {module!r} package, which is not installed: "
            f"pip install {pip_package}"
        ) from err


class BuiltinTracker(GeneralTracker):
    """A tracker shipped here: a thin adapter over one vendor SDK, imported when the run starts."""

    sdk_module = ""  # what `start` imports
    pip_package = ""  # what to install when it is missing

    @classmethod
    def available(cls) -> bool:
        return importlib.util.find_spec(cls.sdk_module.split(".")[0]) is not None

    @classmethod
    def sdk(cls) -> Any:
        return import_sdk(cls.sdk_module, cls.name, cls.pip_package)

    def _warn_dropped(self, key: str, value: Any, why: str) -> None:
        """Say once per key that a value was not logged (the SDK has no place for its type)."""
        seen = self.__dict__.setdefault("_dropped", set())
        if key not in seen:
            seen.add(key)
            logger.warning(
                "%s tracker: %r = %r (%s) was not logged: %s",
                self.name,
                key,
                value,
                type(value).__name__,
                why,
            )
