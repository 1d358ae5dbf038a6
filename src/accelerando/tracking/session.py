"""One Accelerator's trackers: which are live on this rank, the step counter, and failure reports.

Every rank builds the same tracker objects (so `get_tracker` answers everywhere), but only the
main process starts and calls them, unless a tracker sets `main_process_only = False`. The step
counter lives in the checkpoint registry (`TrainingObjects.log_step`), so `save_state` and
`load_state` carry it and a resumed run continues its curves.

A tracker that fails while logging or finishing does not stop training: the failure is logged
with the tracker's name at once, and `end_training` raises `TrackerError` listing every failure
after the process group is gone, so no other rank ever waits on a broken tracker.
"""

from __future__ import annotations

import dataclasses
import operator
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from accelerando.tracking.base import INERT_RUN, GeneralTracker, TrackerError, logger
from accelerando.tracking.registry import LOGGER_TYPE_TO_CLASS, LogWith, filter_trackers
from accelerando.tracking.values import log_values, plain

if TYPE_CHECKING:
    from accelerando.checkpoint.objects import TrainingObjects


class TrackingSession:
    def __init__(
        self,
        log_with: LogWith | list[LogWith] | None,
        logging_dir: str | os.PathLike | None,
        objects: TrainingObjects,
        is_main_process: bool,
    ) -> None:
        self.log_with = filter_trackers(log_with, logging_dir)
        self.logging_dir = logging_dir
        self.trackers: list[GeneralTracker] = []
        self._objects = objects
        self._is_main = is_main_process
        self._live: list[GeneralTracker] = []  # started on this rank and not finished yet
        self._acting: set[int] = set()  # ids of the trackers that act on this rank
        self._failures: dict[str, list[str]] = {}

    # ---- start -------------------------------------------------------------------------------
    def init(
        self,
        project_name: str,
        config: Any = None,
        init_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        if self.trackers:
            raise RuntimeError("init_trackers was already called for this Accelerator; call it once")
        if config is not None and not isinstance(config, Mapping) and not dataclasses.is_dataclass(config):
            raise TypeError(
                f"init_trackers(config=...) takes a dict or a dataclass, got {type(config).__name__}"
            )
        init_kwargs = dict(init_kwargs or {})
        known = set(LOGGER_TYPE_TO_CLASS) | {t.name for t in self.log_with if isinstance(t, GeneralTracker)}
        unknown = sorted(set(init_kwargs) - known)
        if unknown:
            raise ValueError(
                f"init_kwargs has keys {unknown} that name no tracker; keys are tracker names: {sorted(known)}"
            )
        for entry in self.log_with:
            if isinstance(entry, GeneralTracker):
                self.trackers.append(entry)
                continue
            cls = LOGGER_TYPE_TO_CLASS[str(entry)]
            args = (project_name, self.logging_dir) if cls.requires_logging_directory else (project_name,)
            self.trackers.append(cls(*args, **init_kwargs.get(str(entry), {})))
        acting = [t for t in self.trackers if self._is_main or not getattr(t, "main_process_only", True)]
        self._acting = {id(t) for t in acting}
        values = plain(config) if config is not None else None
        for tracker in acting:
            self._setup(tracker, "start")
            self._live.append(tracker)
        if values is not None:
            for tracker in acting:
                self._setup(tracker, "store_init_configuration", values)

    @staticmethod
    def _setup(tracker: GeneralTracker, call: str, *args: Any) -> None:
        """Setup failures raise at once: nothing has been trained yet."""
        try:
            getattr(tracker, call)(*args)
        except Exception as err:
            raise TrackerError(
                f"tracker {tracker.name!r} failed in {call}: {type(err).__name__}: {err}"
            ) from err

    # ---- log ---------------------------------------------------------------------------------
    def log(self, values: Any, step: int | None = None, log_kwargs: Mapping[str, Any] | None = None) -> None:
        """Give `values` the next step (or `step`) on every rank; only live trackers see them."""
        objects = self._objects
        if step is None:
            step = objects.log_step
        else:
            step = operator.index(step)
            if step < 0:
                raise ValueError(f"log(step={step}): steps are integers >= 0")
        if step >= objects.log_step:
            objects.log_step = step + 1
        if not self._live:
            return
        values = log_values(values)
        kwargs = log_kwargs or {}
        for tracker in self._live:
            try:
                tracker.log(values, step=step, **kwargs.get(tracker.name, {}))
            except Exception as err:  # noqa: BLE001 - reported now and by end_training; training goes on
                self._failed(tracker, f"log(step={step})", err)

    def _failed(self, tracker: GeneralTracker, call: str, err: Exception) -> None:
        first = tracker.name not in self._failures
        self._failures.setdefault(tracker.name, []).append(f"{call}: {type(err).__name__}: {err}")
        logger.error(
            "tracker %r failed in %s: %s: %s", tracker.name, call, type(err).__name__, err, exc_info=first
        )

    # ---- look up -----------------------------------------------------------------------------
    def get(self, name: str, unwrap: bool = False) -> Any:
        for tracker in self.trackers:
            if tracker.name == name:
                if id(tracker) not in self._acting:
                    return INERT_RUN if unwrap else tracker  # its methods do nothing on this rank
                return tracker.tracker if unwrap else tracker
        if not self.trackers:  # before init_trackers, or without log_with: an inert tracker, as in Accelerate
            return INERT_RUN if unwrap else GeneralTracker(_blank=True)
        raise ValueError(f"no tracker named {name!r}; this Accelerator has {[t.name for t in self.trackers]}")

    # ---- finish ------------------------------------------------------------------------------
    def finish(self) -> TrackerError | None:
        """Finish every live tracker; the error to raise (naming each failed tracker), or None."""
        live, self._live = self._live, []
        for tracker in live:
            try:
                tracker.finish()
            except Exception as err:  # noqa: BLE001 - finish the others first
                self._failed(tracker, "finish", err)
        if not self._failures:
            return None
        parts = []
        for name, calls in self._failures.items():
            more = f" (and {len(calls) - 1} more failed calls)" if len(calls) > 1 else ""
            parts.append(f"tracker {name!r} failed in {calls[0]}{more}")
        self._failures = {}
        return TrackerError("; ".join(parts))
