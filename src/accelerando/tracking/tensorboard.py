"""TensorBoard through torch's `SummaryWriter` (or tensorboardX's when only that is installed)."""

from __future__ import annotations

import os
from typing import Any

import yaml

from accelerando.tracking.base import BuiltinTracker, on_main_process
from accelerando.tracking.values import flatten
from accelerando.utils.imports import is_tensorboard_available


class TensorBoardTracker(BuiltinTracker):
    """Event files under `logging_dir/run_name`; `init_kwargs["tensorboard"]` go to `SummaryWriter`."""

    name = "tensorboard"
    requires_logging_directory = True
    sdk_module = "torch.utils.tensorboard"
    pip_package = "tensorboard"

    def __init__(self, run_name: str, logging_dir: str | os.PathLike, **kwargs: Any) -> None:
        super().__init__()
        self.run_name = run_name
        self.logging_dir = os.path.join(os.fspath(logging_dir), run_name)
        self.init_kwargs = kwargs
        self.writer: Any = None

    @classmethod
    def available(cls) -> bool:
        return is_tensorboard_available()

    @classmethod
    def sdk(cls) -> Any:
        try:
            return super().sdk()
        except ImportError:  # torch's writer needs the tensorboard package; tensorboardX has its own
            if cls.available():
                import tensorboardX

                return tensorboardX
            raise

    @property
    def tracker(self) -> Any:
        return self.writer

    @on_main_process
    def start(self) -> None:
        self.writer = self.sdk().SummaryWriter(self.logging_dir, **self.init_kwargs)

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """hparams in the event files (flattened, as TensorBoard wants) and `hparams.yml` beside them."""
        flat = flatten(values)
        self.writer.add_hparams(flat, metric_dict={})
        self.writer.flush()
        os.makedirs(self.logging_dir, exist_ok=True)
        target = os.path.join(self.logging_dir, "hparams.yml")
        with open(target + ".tmp", "w") as f:
            yaml.safe_dump(flat, f)
        os.replace(target + ".tmp", target)

    @on_main_process
    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Numbers as scalars, text as text, a dict of numbers as one chart of several scalars."""
        for key, value in values.items():
            if isinstance(value, (int, float)):
                self.writer.add_scalar(key, value, global_step=step, **kwargs)
            elif isinstance(value, str):
                self.writer.add_text(key, value, global_step=step, **kwargs)
            elif isinstance(value, dict):
                self.writer.add_scalars(key, value, global_step=step, **kwargs)
            else:
                self._warn_dropped(key, value, "TensorBoard takes numbers, text or a dict of numbers")
        self.writer.flush()

    @on_main_process
    def log_images(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Each value is a batch of images (N, C, H, W unless `dataformats` says otherwise)."""
        for key, images in values.items():
            self.writer.add_images(key, images, global_step=step, **kwargs)
        self.writer.flush()

    @on_main_process
    def finish(self) -> None:
        self.writer.close()
