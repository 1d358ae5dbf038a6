"""Views of the Accelerator's resolved configuration under Accelerate's attribute names (read-only but `dataloader_config`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from accelerando.config.options import AutocastKwargs, DataLoaderConfiguration, ProjectConfiguration
from accelerando.config.resolve import ResolvedConfig


class ConfigViews:
    """Mixed into `Accelerator`; every property forwards to `self.config` (a `ResolvedConfig`)."""

    config: ResolvedConfig

    @property
    def device_placement(self) -> bool:
        return self.config.device_placement

    @property
    def dataloader_config(self) -> DataLoaderConfiguration:
        return self.config.dataloader

    @dataloader_config.setter
    def dataloader_config(self, value: DataLoaderConfiguration) -> None:
        """Loaders prepared from now on use `value` (Accelerate's attribute is assignable too)."""
        if not isinstance(value, DataLoaderConfiguration):
            raise TypeError(
                f"dataloader_config must be a DataLoaderConfiguration, got {type(value).__name__}"
            )
        self.config = dataclasses.replace(self.config, dataloader=value)

    @property
    def split_batches(self) -> bool:
        return self.config.dataloader.split_batches

    @property
    def dispatch_batches(self) -> bool | None:
        return self.config.dataloader.dispatch_batches

    @property
    def even_batches(self) -> bool:
        return self.config.dataloader.even_batches

    @even_batches.setter
    def even_batches(self, value: bool) -> None:
        self.config.dataloader.even_batches = value

    @property
    def use_seedable_sampler(self) -> bool:
        return self.config.dataloader.use_seedable_sampler

    @property
    def non_blocking(self) -> bool:
        return self.config.dataloader.non_blocking

    @property
    def use_stateful_dataloader(self) -> bool:
        return self.config.dataloader.use_stateful_dataloader

    @property
    def project_configuration(self) -> ProjectConfiguration:
        return self.config.project

    @property
    def project_dir(self) -> str | None:
        return self.config.project.project_dir

    @property
    def logging_dir(self) -> str | None:
        return self.config.project.logging_dir

    @property
    def save_iteration(self) -> int:
        return self.config.project.iteration

    @property
    def step_scheduler_with_optimizer(self) -> bool:
        return self.config.step_scheduler_with_optimizer

    @property
    def rng_types(self) -> list[str]:
        return list(self.config.rng_types)

    @property
    def autocast_handler(self) -> AutocastKwargs:
        return self.config.handlers.autocast

    @property
    def ddp_handler(self) -> Any:
        return self.config.handlers.ddp

    @property
    def scaler_handler(self) -> Any:
        return self.config.handlers.scaler

    @property
    def init_handler(self) -> Any:
        return self.config.handlers.init

    @property
    def profile_handler(self) -> Any:
        return self.config.handlers.profile
