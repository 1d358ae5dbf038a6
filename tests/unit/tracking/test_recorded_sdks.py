"""Comet, ClearML, SwanLab and Trackio through recorded fakes of their SDKs.

These SDKs are not in the test extra (each pulls a large dependency tree, and Trackio a web UI),
so the adapters are checked against the calls they make: a stand-in module records every call,
and each test asserts the exact sequence the vendor's API documents. docs/tracking.md lists which
trackers are tested this way.
"""

from __future__ import annotations

import importlib.machinery
import sys
import types
from unittest import mock

import pytest

from accelerando import Accelerator


def fake_sdk(monkeypatch, name: str, **attrs) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    for key, value in attrs.items():
        setattr(module, key, value)
    monkeypatch.setitem(sys.modules, name, module)
    return module


def run(log_with, init_kwargs=None):
    acc = Accelerator(cpu=True, log_with=log_with)
    acc.init_trackers("proj", config={"lr": 0.1, "opt": {"name": "adam"}}, init_kwargs=init_kwargs)
    acc.log({"loss": 0.5, "note": "text"})
    acc.log({"eval_acc": 0.9}, step=4)
    acc.end_training()
    return acc


def test_comet(monkeypatch):
    experiment = mock.MagicMock(name="experiment")
    sdk = fake_sdk(
        monkeypatch, "comet_ml", __version__="3.45.0", start=mock.MagicMock(return_value=experiment)
    )
    acc = run("comet_ml", {"comet_ml": {"online": False}})
    sdk.start.assert_called_once_with(project_name="proj", online=False)
    assert experiment.mock_calls == [
        mock.call.log_parameters({"lr": 0.1, "opt": {"name": "adam"}}),
        mock.call.set_step(0),
        mock.call.log_metric("loss", 0.5, step=0),
        mock.call.log_other("note", "text"),
        mock.call.set_step(4),
        mock.call.log_metric("eval_acc", 0.9, step=4),
        mock.call.end(),
    ]
    assert acc.get_tracker("comet_ml", unwrap=True) is experiment


def test_clearml(monkeypatch):
    task = mock.MagicMock(name="task")
    Task = mock.MagicMock(name="Task")
    Task.current_task.return_value = None
    Task.init.return_value = task
    fake_sdk(monkeypatch, "clearml", Task=Task)
    run("clearml")
    Task.init.assert_called_once_with(project_name="proj", task_name="proj")
    report = task.get_logger.return_value
    task.connect_configuration.assert_called_once_with({"lr": 0.1, "opt": {"name": "adam"}})
    assert report.mock_calls == [  # steps are always given: a chart, never single values
        mock.call.report_scalar(title="loss", series="train", value=0.5, iteration=0),
        mock.call.report_scalar(title="acc", series="eval", value=0.9, iteration=4),
    ]
    task.close.assert_called_once_with()


def test_clearml_keeps_an_external_task_open(monkeypatch):
    Task = mock.MagicMock(name="Task")
    fake_sdk(monkeypatch, "clearml", Task=Task)
    run("clearml")
    Task.init.assert_not_called()
    Task.current_task.return_value.close.assert_not_called()


@pytest.mark.parametrize("name", ["swanlab", "trackio"])
def test_init_run_sdks(monkeypatch, name):
    the_run = mock.MagicMock(name="run")
    sdk = fake_sdk(monkeypatch, name, init=mock.MagicMock(return_value=the_run), config=mock.MagicMock())
    run(name, {name: {"mode": "offline"}})
    sdk.init.assert_called_once_with(project="proj", mode="offline")
    sdk.config.update.assert_called_once_with({"lr": 0.1, "opt": {"name": "adam"}}, allow_val_change=True)
    assert the_run.mock_calls == [
        mock.call.log({"loss": 0.5, "note": "text"}, step=0),  # the step always reaches the SDK
        mock.call.log({"eval_acc": 0.9}, step=4),
        mock.call.finish(),
    ]
