"""`get_logger`: a logger that speaks once (main process) or in rank order, on request per call."""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

from accelerando import _runtime
from accelerando.config import env


class MultiProcessAdapter(logging.LoggerAdapter):
    """Adds `main_process_only=True` (default) and `in_order=False` keywords to every log call."""

    @staticmethod
    def _should_log(main_process_only: bool) -> bool:
        runtime = _runtime.current()
        return not main_process_only or runtime is None or runtime.topology.rank == 0

    def log(self, level: int, msg: Any, *args: Any, **kwargs: Any) -> None:
        if _runtime.current() is None:
            raise RuntimeError(
                "get_logger() loggers need the process state: create an Accelerator or PartialState first"
            )
        main_process_only = kwargs.pop("main_process_only", True)
        in_order = kwargs.pop("in_order", False)
        kwargs.setdefault("stacklevel", 2)
        if not self.isEnabledFor(level):
            return
        if in_order:
            from accelerando.state import PartialState

            state = PartialState()
            for rank in range(state.num_processes):
                if rank == state.process_index:
                    msg2, kw = self.process(msg, kwargs)
                    self.logger.log(level, msg2, *args, **kw)
                state.wait_for_everyone()
        elif self._should_log(main_process_only):
            msg2, kw = self.process(msg, kwargs)
            self.logger.log(level, msg2, *args, **kw)

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        return msg, kwargs


def get_logger(name: str, log_level: str | None = None) -> MultiProcessAdapter:
    """A logger for `name`; level from `log_level`, else ACCELERANDO_LOG_LEVEL."""
    logger = logging.getLogger(name)
    level = log_level or env.lookup("LOG_LEVEL")
    if level is not None:
        logger.setLevel(level.upper())
        logger.root.setLevel(level.upper())
    return MultiProcessAdapter(logger, {})
