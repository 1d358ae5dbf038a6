"""Aim: a `Run` in the repository at `logging_dir`."""

from __future__ import annotations

import os
from typing import Any

from accelerando.tracking.base import BuiltinTracker, on_main_process


class AimTracker(BuiltinTracker):
    """`aim.Run(repo=logging_dir, **init_kwargs["aim"])`, named after the project."""

    name = "aim"
    requires_logging_directory = True
    sdk_module = "aim"
    pip_package = "aim"

    def __init__(self, run_name: str, logging_dir: str | os.PathLike | None = ".", **kwargs: Any) -> None:
        super().__init__()
        self.run_name = run_name
        self.repo_path = os.fspath(logging_dir) if logging_dir is not None else "."
        self.init_kwargs = kwargs
        self.writer: Any = None

    @property
    def tracker(self) -> Any:
        return self.writer

    @on_main_process
    def start(self) -> None:
        self.writer = self.sdk().Run(repo=self.repo_path, **self.init_kwargs)
        self.writer.name = self.run_name

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.writer["hparams"] = values

    @on_main_process
    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        for key, value in values.items():
            self.writer.track(value, name=key, step=step, **kwargs)

    @on_main_process
    def log_images(
        self, values: dict[str, Any], step: int | None = None, kwargs: dict[str, dict] | None = None
    ) -> None:
        """Each value is an image or `(image, caption)`; `kwargs` may hold "aim_image" and "track" dicts."""
        aim = self.sdk()
        image_kw = (kwargs or {}).get("aim_image", {})
        track_kw = (kwargs or {}).get("track", {})
        for key, value in values.items():
            image, caption = value if isinstance(value, tuple) else (value, "")
            self.writer.track(aim.Image(image, caption=caption, **image_kw), name=key, step=step, **track_kw)

    @on_main_process
    def finish(self) -> None:
        self.writer.close()
