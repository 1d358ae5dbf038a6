"""MLflow: one run in an experiment named after the project; `MLFLOW_TRACKING_URI` says where."""

from __future__ import annotations

import json
import os
from typing import Any

from accelerando.config import env
from accelerando.tracking.base import BuiltinTracker, on_main_process
from accelerando.tracking.values import flatten


class MLflowTracker(BuiltinTracker):
    """`MLFLOW_EXPERIMENT_NAME`, `MLFLOW_RUN_ID`, `MLFLOW_TAGS` (JSON) and `MLFLOW_NESTED_RUN`
    override the arguments, as in Accelerate; `logging_dir` is the new experiment's artifact location."""

    name = "mlflow"
    requires_logging_directory = False
    sdk_module = "mlflow"
    pip_package = "mlflow"

    def __init__(
        self,
        experiment_name: str | None = None,
        logging_dir: str | os.PathLike | None = None,
        run_id: str | None = None,
        tags: dict[str, Any] | str | None = None,
        nested_run: bool | None = False,
        run_name: str | None = None,
        description: str | None = None,
    ) -> None:
        super().__init__()
        tags = env.raw("MLFLOW_TAGS") or tags
        nested = env.raw("MLFLOW_NESTED_RUN")
        self.experiment_name = env.raw("MLFLOW_EXPERIMENT_NAME") or experiment_name
        self.logging_dir = os.fspath(logging_dir) if logging_dir is not None else None
        self.run_id = env.raw("MLFLOW_RUN_ID") or run_id
        self.tags = json.loads(tags) if isinstance(tags, str) else tags
        self.nested_run = env.parse_bool(nested, "MLFLOW_NESTED_RUN") if nested else bool(nested_run)
        self.run_name = run_name
        self.description = description
        self.active_run: Any = None

    @property
    def tracker(self) -> Any:
        return self.active_run

    @on_main_process
    def start(self) -> None:
        mlflow = self.sdk()
        found = mlflow.search_experiments(filter_string=f"name = '{self.experiment_name}'")
        if found:
            experiment_id = found[0].experiment_id
        else:
            experiment_id = mlflow.create_experiment(
                name=self.experiment_name, artifact_location=self.logging_dir, tags=self.tags
            )
        self.active_run = mlflow.start_run(
            run_id=self.run_id,
            experiment_id=experiment_id,
            run_name=self.run_name,
            nested=self.nested_run,
            tags=self.tags,
            description=self.description,
        )

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Params are flat strings of bounded length, sent in batches of MLflow's maximum size."""
        mlflow = self.sdk()
        limits = mlflow.utils.validation
        params = {}
        for key, value in flatten(values).items():
            if len(str(value)) > limits.MAX_PARAM_VAL_LENGTH:
                self._warn_dropped(
                    key, value, f"MLflow params hold at most {limits.MAX_PARAM_VAL_LENGTH} characters"
                )
            else:
                params[key] = value
        items = list(params.items())
        batch = limits.MAX_PARAMS_TAGS_PER_BATCH
        for i in range(0, len(items), batch):
            mlflow.log_params(dict(items[i : i + batch]))

    @on_main_process
    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        metrics = {}
        for key, value in values.items():
            if isinstance(value, (int, float)):
                metrics[key] = value
            else:
                self._warn_dropped(key, value, "MLflow metrics are numbers")
        self.sdk().log_metrics(metrics, step=step, **kwargs)

    @on_main_process
    def log_figure(self, figure: Any, artifact_file: str, **save_kwargs: Any) -> None:
        self.sdk().log_figure(figure=figure, artifact_file=artifact_file, **save_kwargs)

    @on_main_process
    def log_artifacts(self, local_dir: str, artifact_path: str | None = None) -> None:
        self.sdk().log_artifacts(local_dir=local_dir, artifact_path=artifact_path)

    @on_main_process
    def log_artifact(self, local_path: str, artifact_path: str | None = None) -> None:
        self.sdk().log_artifact(local_path=local_path, artifact_path=artifact_path)

    @on_main_process
    def finish(self) -> None:
        self.sdk().end_run()
