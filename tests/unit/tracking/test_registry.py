"""`log_with` resolution: names, LoggerType, instances, lists, "all"; what is refused and why."""

from __future__ import annotations

import pytest

import accelerando.tracking as tracking
from accelerando import Accelerator
from accelerando.tracking import (
    LOGGER_TYPE_TO_CLASS,
    GeneralTracker,
    LoggerType,
    TensorBoardTracker,
    filter_trackers,
    get_available_trackers,
    register_tracker_class,
)
from accelerando.utils import is_comet_ml_available, is_tensorboard_available


class Mine(GeneralTracker):
    name = "mine"
    requires_logging_directory = False

    @property
    def tracker(self):
        return None


@pytest.fixture
def registry():
    saved = dict(LOGGER_TYPE_TO_CLASS)
    yield LOGGER_TYPE_TO_CLASS
    LOGGER_TYPE_TO_CLASS.clear()
    LOGGER_TYPE_TO_CLASS.update(saved)


def test_every_accelerate_name_is_registered():
    assert set(LOGGER_TYPE_TO_CLASS) == set(LoggerType.list()) - {"all"}
    assert all(LOGGER_TYPE_TO_CLASS[n].name == n for n in LOGGER_TYPE_TO_CLASS)


def test_names_enums_instances_and_lists(tmp_path):
    mine = Mine()
    assert filter_trackers(None) == []
    assert filter_trackers("tensorboard", tmp_path) == [LoggerType.TENSORBOARD]
    assert filter_trackers(LoggerType.TENSORBOARD, tmp_path) == [LoggerType.TENSORBOARD]
    assert filter_trackers(["TensorBoard", "tensorboard", mine], tmp_path) == [LoggerType.TENSORBOARD, mine]
    everything = filter_trackers(["all", mine], tmp_path)
    assert everything[-1] is mine and set(everything[:-1]) == set(get_available_trackers())


@pytest.mark.skipif(not is_tensorboard_available(), reason="tensorboard is in the test extra")
def test_all_leaves_out_what_needs_a_directory_when_there_is_none():
    assert LoggerType.TENSORBOARD in get_available_trackers()
    assert LoggerType.TENSORBOARD not in filter_trackers("all")


def test_refusals_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match=r"'tensorbord' is not a tracker; accepted: 'all', 'tensorboard'"):
        filter_trackers("tensorbord")
    with pytest.raises(ValueError, match="is not a tracker"):
        filter_trackers([Mine])  # the class, not an instance
    with pytest.raises(ValueError, match="'tensorboard' tracker writes files and needs a directory"):
        Accelerator(cpu=True, log_with="tensorboard")


@pytest.mark.skipif(is_comet_ml_available(), reason="needs comet_ml to be absent")
def test_missing_sdk_names_the_pip_package():
    with pytest.raises(
        ImportError, match=r"'comet_ml' tracker needs the 'comet_ml' package.*pip install comet-ml"
    ):
        Accelerator(cpu=True, log_with="comet_ml")
    assert LoggerType.COMETML not in get_available_trackers()


def test_register_tracker_class(registry, tmp_path):
    register_tracker_class(Mine)
    assert filter_trackers("mine") == ["mine"]
    acc = Accelerator(cpu=True, log_with="mine")
    acc.init_trackers("p")
    assert isinstance(acc.get_tracker("mine"), Mine)
    with pytest.warns(UserWarning, match="'mine' was registered to Mine"):
        register_tracker_class(Mine)
    with pytest.raises(ValueError, match="GeneralTracker subclass"):
        register_tracker_class(Mine())  # type: ignore[arg-type]

    class Nameless(GeneralTracker):
        requires_logging_directory = False

    with pytest.raises(ValueError, match="non-empty string class attribute `name`"):
        register_tracker_class(Nameless)

    class Shadow(TensorBoardTracker):
        name = "tensorboard"
        requires_logging_directory = False

    with pytest.warns(UserWarning):
        register_tracker_class(Shadow)
    assert filter_trackers("tensorboard") == [LoggerType.TENSORBOARD]  # no directory needed any more


def test_a_tracker_class_missing_its_contract_says_what():
    class Half(GeneralTracker):
        name = "half"

    with pytest.raises(NotImplementedError, match="`requires_logging_directory`, `tracker`"):
        Half()
    GeneralTracker(_blank=True)  # what get_tracker returns before init_trackers


def test_public_module_matches_accelerate():
    accelerate_tracking = pytest.importorskip("accelerate.tracking")
    for name in (
        "GeneralTracker",
        "on_main_process",
        "filter_trackers",
        "get_available_trackers",
        "register_tracker_class",
        "LOGGER_TYPE_TO_CLASS",
        "TensorBoardTracker",
        "WandBTracker",
        "MLflowTracker",
        "AimTracker",
        "CometMLTracker",
        "ClearMLTracker",
        "DVCLiveTracker",
        "SwanLabTracker",
        "TrackioTracker",
    ):
        assert hasattr(accelerate_tracking, name) and hasattr(tracking, name), name


def test_availability_probes_match_accelerate():
    accelerate_utils = pytest.importorskip("accelerate.utils")
    import accelerando.utils as ours

    for sdk in (
        "aim",
        "comet_ml",
        "clearml",
        "dvclive",
        "mlflow",
        "swanlab",
        "tensorboard",
        "trackio",
        "wandb",
    ):
        name = f"is_{sdk}_available"
        assert hasattr(accelerate_utils, name) and getattr(ours, name)() == bool(
            getattr(accelerate_utils, name)()
        ), name
