"""Trackers whose SDK follows W&B's shape: `sdk.init(project=...)` returns a run with `log(values,
step=)` and `finish()`. Weights & Biases, Trackio and SwanLab differ only in where the config goes
and which media types they have.

Unlike Accelerate (`main_process_only = False` for these three), the run is the main process's
alone: other ranks opening runs of their own is the bug users hit most with these SDKs.
"""

from __future__ import annotations

from typing import Any

from accelerando.tracking.base import BuiltinTracker, on_main_process


class InitRunTracker(BuiltinTracker):
    requires_logging_directory = False

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        super().__init__()
        self.run_name = run_name
        self.init_kwargs = kwargs
        self.run: Any = None

    @property
    def tracker(self) -> Any:
        return self.run

    @on_main_process
    def start(self) -> None:
        self.run = self.sdk().init(project=self.run_name, **self.init_kwargs)

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.sdk().config.update(values, allow_val_change=True)

    @on_main_process
    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        self.run.log(values, step=step, **kwargs)

    @on_main_process
    def finish(self) -> None:
        self.run.finish()

    def _log_image_lists(self, values: dict[str, Any], step: int | None, **kwargs: Any) -> None:
        image = self.sdk().Image
        self.run.log({k: [image(x) for x in v] for k, v in values.items()}, step=step, **kwargs)


class WandBTracker(InitRunTracker):
    """`wandb.init(project=run_name, **init_kwargs["wandb"])`; `WANDB_MODE=offline` works as usual."""

    name = "wandb"
    sdk_module = "wandb"
    pip_package = "wandb"

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.run.config.update(values, allow_val_change=True)

    @on_main_process
    def log_images(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Each value is a list of images (arrays or PIL images)."""
        self._log_image_lists(values, step, **kwargs)

    @on_main_process
    def log_table(
        self,
        table_name: str,
        columns: list[str] | None = None,
        data: list[list[Any]] | None = None,
        dataframe: Any = None,
        step: int | None = None,
        **kwargs: Any,
    ) -> None:
        table = self.sdk().Table(columns=columns, data=data, dataframe=dataframe)
        self.run.log({table_name: table}, step=step, **kwargs)


class TrackioTracker(InitRunTracker):
    """`trackio.init(project=run_name, **init_kwargs["trackio"])`; the step is passed (Accelerate's
    tracker once dropped it)."""

    name = "trackio"
    sdk_module = "trackio"
    pip_package = "trackio"


class SwanLabTracker(InitRunTracker):
    """`swanlab.init(project=run_name, **init_kwargs["swanlab"])` (`mode="offline"` for no server)."""

    name = "swanlab"
    sdk_module = "swanlab"
    pip_package = "swanlab"

    @on_main_process
    def log_images(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Each value is a list of images (arrays or PIL images)."""
        self._log_image_lists(values, step, **kwargs)
