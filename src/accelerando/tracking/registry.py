"""Which tracker a `log_with` entry names, and whether it can run here."""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from typing import Any, Union

from accelerando.config.options import LoggerType
from accelerando.tracking.aim import AimTracker
from accelerando.tracking.base import BuiltinTracker, GeneralTracker, logger
from accelerando.tracking.clearml import ClearMLTracker
from accelerando.tracking.comet_ml import CometMLTracker
from accelerando.tracking.dvclive import DVCLiveTracker
from accelerando.tracking.mlflow import MLflowTracker
from accelerando.tracking.runs import SwanLabTracker, TrackioTracker, WandBTracker
from accelerando.tracking.tensorboard import TensorBoardTracker

LogWith = Union[str, LoggerType, GeneralTracker]

BUILTIN_TRACKERS: tuple[type[BuiltinTracker], ...] = (
    TensorBoardTracker,
    WandBTracker,
    CometMLTracker,
    AimTracker,
    MLflowTracker,
    ClearMLTracker,
    DVCLiveTracker,
    SwanLabTracker,
    TrackioTracker,
)

LOGGER_TYPE_TO_CLASS: dict[str, type[GeneralTracker]] = {cls.name: cls for cls in BUILTIN_TRACKERS}


def register_tracker_class(tracker_class: type[GeneralTracker]) -> None:
    """Make `log_with="<tracker_class.name>"` build `tracker_class` (before creating the Accelerator).

    It is built as `tracker_class(project_name, [logging_dir,] **init_kwargs[name])`, like the
    built-in ones.
    """
    if not (isinstance(tracker_class, type) and issubclass(tracker_class, GeneralTracker)):
        raise ValueError(f"register_tracker_class takes a GeneralTracker subclass, got {tracker_class!r}")
    name = getattr(tracker_class, "name", None)
    if not name or not isinstance(name, str):
        raise ValueError(f"{tracker_class.__name__} needs a non-empty string class attribute `name`")
    if not hasattr(tracker_class, "requires_logging_directory"):
        raise ValueError(
            f"{tracker_class.__name__} needs a class attribute `requires_logging_directory` (True or False)"
        )
    if name in LOGGER_TYPE_TO_CLASS:
        warnings.warn(
            f"tracker name {name!r} was registered to {LOGGER_TYPE_TO_CLASS[name].__name__}; "
            f"{tracker_class.__name__} replaces it",
            stacklevel=2,
        )
    LOGGER_TYPE_TO_CLASS[name] = tracker_class


def get_available_trackers() -> list[LoggerType]:
    """The built-in trackers whose SDK is installed."""
    return [LoggerType(cls.name) for cls in BUILTIN_TRACKERS if cls.available()]


def _key(entry: Any) -> str | None:
    """The registry name a `log_with` entry spells, or None when it spells none."""
    if isinstance(entry, str):  # LoggerType is a str too
        return str(entry).lower()
    return None


def filter_trackers(
    log_with: LogWith | Sequence[LogWith] | None, logging_dir: str | os.PathLike | None = None
) -> list[Any]:
    """Resolve `log_with` into tracker names (LoggerType for built-ins) and instances, in order.

    A named tracker whose SDK is missing, an unknown name, or a tracker that needs a directory
    without one is an error here, before any training; `"all"` takes what is installed (and, with
    no logging directory, leaves out those that need one).
    """
    if log_with is None:
        return []
    entries = list(log_with) if isinstance(log_with, (list, tuple)) else [log_with]
    chosen: list[Any] = []
    names: set[str] = set()

    def add(name: str) -> None:
        if name not in names:
            names.add(name)
            chosen.append(LoggerType(name) if name in LoggerType else name)

    for entry in entries:
        if isinstance(entry, GeneralTracker):
            chosen.append(entry)
            continue
        name = _key(entry)
        if name == "all":
            for builtin in get_available_trackers():
                if LOGGER_TYPE_TO_CLASS[str(builtin)].requires_logging_directory and logging_dir is None:
                    logger.warning(
                        "log_with='all': %s left out, it needs project_dir or logging_dir", builtin
                    )
                    continue
                add(str(builtin))
            continue
        if name is None or name not in LOGGER_TYPE_TO_CLASS:
            raise ValueError(
                f"log_with entry {entry!r} is not a tracker; accepted: 'all', "
                f"{', '.join(repr(n) for n in LOGGER_TYPE_TO_CLASS)}, a GeneralTracker instance, "
                "or a name given to register_tracker_class"
            )
        cls = LOGGER_TYPE_TO_CLASS[name]
        if isinstance(cls, type) and issubclass(cls, BuiltinTracker) and not cls.available():
            cls.sdk()  # raises ImportError naming the pip package
        if cls.requires_logging_directory and logging_dir is None:
            raise ValueError(
                f"the {name!r} tracker writes files and needs a directory: pass "
                "Accelerator(project_dir=...) or project_config=ProjectConfiguration(logging_dir=...)"
            )
        add(name)
    return chosen
