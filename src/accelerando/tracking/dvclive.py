"""DVCLive: a `Live` (yours, or one built from `init_kwargs["dvclive"]`)."""

from __future__ import annotations

from typing import Any

from accelerando.tracking.base import BuiltinTracker, on_main_process


class DVCLiveTracker(BuiltinTracker):
    """`run_name` is not used by DVCLive: `init_kwargs["dvclive"]` (e.g. `dir`) go to `dvclive.Live`."""

    name = "dvclive"
    requires_logging_directory = False
    sdk_module = "dvclive"
    pip_package = "dvclive"

    def __init__(self, run_name: str | None = None, live: Any = None, **kwargs: Any) -> None:
        super().__init__()
        self.live = live
        self.init_kwargs = kwargs

    @property
    def tracker(self) -> Any:
        return self.live

    @on_main_process
    def start(self) -> None:
        if self.live is None:
            self.live = self.sdk().Live(**self.init_kwargs)

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.live.log_params(values)

    @on_main_process
    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """One DVCLive step per call: metrics written at `step`, then `next_step()`."""
        from dvclive.plots import Metric

        if step is not None:
            self.live.step = step
        for key, value in values.items():
            if Metric.could_log(value):
                self.live.log_metric(key, value, **kwargs)
            else:
                self._warn_dropped(key, value, "DVCLive metrics are numbers")
        self.live.next_step()

    @on_main_process
    def finish(self) -> None:
        self.live.end()
