"""Comet: `comet_ml.start(project_name=run_name, ...)` (3.41+), else an `Experiment`."""

from __future__ import annotations

from typing import Any

from packaging import version

from accelerando.tracking.base import BuiltinTracker, on_main_process


class CometMLTracker(BuiltinTracker):
    """API keys come from Comet's own config; `init_kwargs["comet_ml"]` go to `start`
    (`online=False` keeps the experiment in a local archive)."""

    name = "comet_ml"
    requires_logging_directory = False
    sdk_module = "comet_ml"
    pip_package = "comet-ml"

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        super().__init__()
        self.run_name = run_name
        self.init_kwargs = kwargs
        self.writer: Any = None

    @property
    def tracker(self) -> Any:
        return self.writer

    @on_main_process
    def start(self) -> None:
        comet_ml = self.sdk()
        if version.parse(comet_ml.__version__) >= version.parse("3.41.0"):
            self.writer = comet_ml.start(project_name=self.run_name, **self.init_kwargs)
        else:
            self.writer = comet_ml.Experiment(project_name=self.run_name, **self.init_kwargs)

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.writer.log_parameters(values)

    @on_main_process
    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        if step is not None:
            self.writer.set_step(step)
        for key, value in values.items():
            if isinstance(value, (int, float)):
                self.writer.log_metric(key, value, step=step, **kwargs)
            elif isinstance(value, str):
                self.writer.log_other(key, value, **kwargs)
            elif isinstance(value, dict):
                self.writer.log_metrics(value, step=step, **kwargs)
            else:
                self._warn_dropped(key, value, "Comet takes numbers, text or a dict of numbers")

    @on_main_process
    def finish(self) -> None:
        self.writer.end()
