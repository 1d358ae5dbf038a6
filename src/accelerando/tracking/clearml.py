"""ClearML: a `Task` (or the one already running); `eval_`/`test_`/`train_` prefixes pick the series."""

from __future__ import annotations

from typing import Any

from accelerando.config import env
from accelerando.tracking.base import BuiltinTracker, on_main_process

_SERIES = ("eval", "test", "train")


def title_series(name: str) -> tuple[str, str]:
    """`eval_loss` -> ("loss", "eval"); a name without a known prefix goes to the "train" series."""
    for prefix in _SERIES:
        if name.startswith(prefix + "_"):
            return name[len(prefix) + 1 :], prefix
    return name, "train"


class ClearMLTracker(BuiltinTracker):
    """`CLEARML_PROJECT` / `CLEARML_TASK` name the task unless `init_kwargs["clearml"]` do;
    `Task.set_offline(True)` before `init_trackers` keeps it local."""

    name = "clearml"
    requires_logging_directory = False
    sdk_module = "clearml"
    pip_package = "clearml"

    def __init__(self, run_name: str | None = None, **kwargs: Any) -> None:
        super().__init__()
        self.run_name = run_name
        self.init_kwargs = kwargs
        self.task: Any = None
        self._external = False

    @property
    def tracker(self) -> Any:
        return self.task

    @on_main_process
    def start(self) -> None:
        Task = self.sdk().Task
        current = Task.current_task()
        if current:  # the user's script started the task: log into it, never close it
            self.task, self._external = current, True
            return
        kwargs = dict(self.init_kwargs)
        kwargs.setdefault("project_name", env.raw("CLEARML_PROJECT") or self.run_name)
        kwargs.setdefault("task_name", env.raw("CLEARML_TASK") or self.run_name)
        self.task = Task.init(**kwargs)

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> Any:
        return self.task.connect_configuration(values)

    @on_main_process
    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """With a step, scalars on a chart; without one, single values."""
        report = self.task.get_logger()
        for key, value in values.items():
            if not isinstance(value, (int, float)):
                self._warn_dropped(key, value, "ClearML scalars are numbers")
            elif step is None:
                report.report_single_value(name=key, value=value, **kwargs)
            else:
                title, series = title_series(key)
                report.report_scalar(title=title, series=series, value=value, iteration=step, **kwargs)

    @on_main_process
    def log_images(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        report = self.task.get_logger()
        for key, image in values.items():
            title, series = title_series(key)
            report.report_image(title=title, series=series, iteration=step, image=image, **kwargs)

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
        """`dataframe`, or `data` rows (after a header row made of `columns` when given)."""
        if dataframe is None and data is None:
            raise ValueError("ClearMLTracker.log_table needs `data` (rows) or `dataframe`; got neither")
        table: Any = dataframe
        if table is None:
            rows = list(data or [])
            table = [columns, *rows] if columns else rows
        title, series = title_series(table_name)
        self.task.get_logger().report_table(
            title=title, series=series, table_plot=table, iteration=step, **kwargs
        )

    @on_main_process
    def finish(self) -> None:
        if self.task is not None and not self._external:
            self.task.close()
