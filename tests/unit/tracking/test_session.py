"""The Accelerator's tracking API on one process: steps, config, look-ups, failures, resume."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch

from accelerando import Accelerator, ProjectConfiguration
from accelerando.tracking import GeneralTracker, TrackerError
from accelerando.tracking.base import INERT_RUN, on_main_process


class ListTracker(GeneralTracker):
    """Records every call, the way a user's own tracker would."""

    name = "list"
    requires_logging_directory = False

    def __init__(self, name="list", fail_in=()):
        super().__init__()
        self.name = name
        self.calls: list[tuple] = []
        self.fail_in = set(fail_in)

    @property
    def tracker(self):
        return self.calls

    def _record(self, call, *args):
        if call in self.fail_in:
            raise OSError(f"{self.name} cannot {call}")
        self.calls.append((call, *args))

    def start(self):
        self._record("start")

    def store_init_configuration(self, values):
        self._record("config", values)

    def log(self, values, step=None, **kwargs):
        self._record("log", values, step, kwargs)

    def finish(self):
        self._record("finish")


def logged(tracker):
    return [(c[2], c[1]) for c in tracker.calls if c[0] == "log"]


def test_counter_numbers_every_log_and_follows_explicit_steps():
    t = ListTracker()
    acc = Accelerator(cpu=True, log_with=t)
    acc.init_trackers("p")
    acc.log({"a": 1})
    acc.log({"a": 2})
    acc.log({"eval": 3}, step=10)
    acc.log({"a": 4})
    acc.log({"late": 5}, step=4)  # an earlier step does not move the counter back
    acc.log({"a": 6})
    assert [s for s, _ in logged(t)] == [0, 1, 10, 11, 4, 12]
    with pytest.raises(ValueError, match="steps are integers >= 0"):
        acc.log({"a": 1}, step=-1)
    with pytest.raises(TypeError):
        acc.log({"a": 1}, step=1.5)


def test_config_is_converted_and_kwargs_are_routed():
    @dataclasses.dataclass
    class Cfg:
        dtype: torch.dtype = torch.float32

    a, b = ListTracker("a"), ListTracker("b")
    acc = Accelerator(cpu=True, log_with=[a, b])
    acc.init_trackers("p", config={"cfg": Cfg(), "lr": torch.tensor(0.5)})
    assert a.calls[:2] == [("start",), ("config", {"cfg": {"dtype": "torch.float32"}, "lr": 0.5})]
    acc.log({"loss": torch.tensor(1.5)}, log_kwargs={"b": {"commit": False}})
    assert a.calls[-1] == ("log", {"loss": 1.5}, 0, {})
    assert b.calls[-1] == ("log", {"loss": 1.5}, 0, {"commit": False})
    assert acc.trackers == [a, b] and acc.log_with == [a, b]
    with pytest.raises(RuntimeError, match="already called"):
        acc.init_trackers("p")


def test_init_kwargs_must_name_trackers():
    acc = Accelerator(cpu=True, log_with=ListTracker())
    with pytest.raises(ValueError, match=r"init_kwargs has keys \['wandbb'\] that name no tracker"):
        acc.init_trackers("p", init_kwargs={"wandbb": {}})
    with pytest.raises(TypeError, match="takes a dict or a dataclass, got list"):
        acc.init_trackers("p", config=[1, 2])


def test_get_tracker():
    t = ListTracker()
    acc = Accelerator(cpu=True, log_with=t)
    blank = acc.get_tracker("list")  # before init_trackers: inert, as in Accelerate
    assert type(blank) is GeneralTracker and acc.get_tracker("list", unwrap=True) is INERT_RUN
    acc.init_trackers("p")
    assert acc.get_tracker("list") is t and acc.get_tracker("list", unwrap=True) is t.calls
    with pytest.raises(ValueError, match=r"no tracker named 'wandb'; this Accelerator has \['list'\]"):
        acc.get_tracker("wandb")


def test_inert_run_takes_any_call():
    assert INERT_RUN.log_artifact("x").config.update({"a": 1}) is INERT_RUN
    assert not INERT_RUN


def test_failures_are_reported_by_name_and_training_goes_on(caplog):
    good, bad = ListTracker("good"), ListTracker("bad", fail_in={"log", "finish"})
    acc = Accelerator(cpu=True, log_with=[bad, good])
    acc.init_trackers("p")
    with caplog.at_level(logging.ERROR, logger="accelerando.tracking"):
        acc.log({"a": 1})
        acc.log({"a": 2})
    assert "tracker 'bad' failed in log(step=0): OSError: bad cannot log" in caplog.text
    assert [s for s, _ in logged(good)] == [0, 1]  # the other tracker still got everything
    with pytest.raises(TrackerError) as info:
        acc.end_training()
    assert str(info.value) == (
        "tracker 'bad' failed in log(step=0): OSError: bad cannot log (and 2 more failed calls)"
    )
    assert good.calls[-1] == ("finish",)
    acc.log({"a": 3})  # after end_training: nothing is live any more
    assert len(logged(good)) == 2


def test_a_failing_start_raises_at_once():
    acc = Accelerator(cpu=True, log_with=ListTracker("x", fail_in={"start"}))
    with pytest.raises(TrackerError, match="tracker 'x' failed in start: OSError: x cannot start"):
        acc.init_trackers("p")


def test_on_main_process_guards_by_the_tracker_flag(monkeypatch):
    class T(ListTracker):
        @on_main_process
        def log(self, values, step=None, **kwargs):
            super().log(values, step, **kwargs)

    t = T()
    monkeypatch.setattr("accelerando.tracking.base._is_main_process", lambda: False)
    t.log({"a": 1})
    assert t.calls == []
    t.main_process_only = False
    t.log({"a": 1})
    assert len(t.calls) == 1


def test_save_state_carries_the_step(tmp_path):
    def build(t):
        acc = Accelerator(cpu=True, log_with=t, project_config=ProjectConfiguration(str(tmp_path)))
        model = acc.prepare(torch.nn.Linear(2, 1))
        acc.init_trackers("p")
        return acc, model

    first = ListTracker()
    acc, _ = build(first)
    for i in range(3):
        acc.log({"i": i})
    acc.save_state(str(tmp_path / "ckpt"))
    acc.log({"i": 99})  # after the checkpoint: the resumed run overwrites this step, as it should
    from accelerando.state import reset_runtime

    reset_runtime()
    second = ListTracker()
    acc, _ = build(second)
    acc.load_state(str(tmp_path / "ckpt"))
    acc.log({"i": 3})
    assert [s for s, _ in logged(first)] == [0, 1, 2, 3] and logged(second) == [(3, {"i": 3})]
