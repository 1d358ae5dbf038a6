"""Read-only views of the Accelerator's resolved configuration, under Accelerate's attribute names."""

from __future__ import annotations

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
