"""Experiment tracking with Accelerate's names: `GeneralTracker`, the built-in trackers (thin
adapters over their vendors' SDKs, imported when a run starts), and the registry.

See docs/tracking.md.
"""

from accelerando.config.options import LoggerType
from accelerando.tracking.aim import AimTracker
from accelerando.tracking.base import GeneralTracker, TrackerError, on_main_process
from accelerando.tracking.clearml import ClearMLTracker
from accelerando.tracking.comet_ml import CometMLTracker
from accelerando.tracking.dvclive import DVCLiveTracker
from accelerando.tracking.mlflow import MLflowTracker
from accelerando.tracking.registry import (
    LOGGER_TYPE_TO_CLASS,
    filter_trackers,
    get_available_trackers,
    register_tracker_class,
)
from accelerando.tracking.runs import SwanLabTracker, TrackioTracker, WandBTracker
from accelerando.tracking.tensorboard import TensorBoardTracker

__all__ = [
    "LOGGER_TYPE_TO_CLASS",
    "AimTracker",
    "ClearMLTracker",
    "CometMLTracker",
    "DVCLiveTracker",
    "GeneralTracker",
    "LoggerType",
    "MLflowTracker",
    "SwanLabTracker",
    "TensorBoardTracker",
    "TrackerError",
    "TrackioTracker",
    "WandBTracker",
    "filter_trackers",
    "get_available_trackers",
    "on_main_process",
    "register_tracker_class",
]
