"""Trackers on 2 ranks, and a resume in a fresh launch that continues the curves (see
scripts/tracking_run.py): only rank 0 writes, every value arrives with its step, steps continue
without a gap or an overlap after load_state, a tracker failing in finish lets both ranks exit."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from accelerando.testing import run_distributed

SCRIPT = Path(__file__).parent / "scripts" / "tracking_run.py"


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_trackers_on_two_ranks_and_resume(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for phase in ("first", "resume"):
        run_distributed(SCRIPT, [phase, str(tmp_path)], timeout=120)
    runs = {
        phase: {r: json.loads((tmp_path / f"result.{phase}.rank{r}.json").read_text()) for r in (0, 1)}
        for phase in ("first", "resume")
    }
    losses = runs["first"][0]["losses"] + runs["resume"][0]["losses"]
    assert runs["first"][1]["losses"] == runs["first"][0]["losses"]  # reduced: the same on both ranks

    # The failing tracker is named on rank 0, the other trackers were still finished, and neither
    # rank waited on it.
    ends = runs["first"]
    assert (
        ends[0]["end_error"] == "tracker 'fails_at_finish' failed in finish: ConnectionError: upload refused"
    )
    assert ends[1]["end_error"] is None
    assert all(runs[phase][r]["end_seconds"] < 10 for phase in runs for r in (0, 1))

    # Only rank 0 wrote: one recorder file, and TensorBoard event files from rank 0's processes only.
    assert not (tmp_path / "recorder.rank1.jsonl").exists()
    events = sorted((tmp_path / "run").glob("events.out.tfevents.*"))
    assert len(events) == 2
    assert {p.name.split(".")[-2] for p in events} == {str(runs[ph][0]["pid"]) for ph in runs}

    # Every value with its step; the resumed launch goes on at 6: no gap, no overlap.
    logged = [r for r in records(tmp_path / "recorder.rank0.jsonl") if "step" in r]
    assert [r["step"] for r in logged] == list(range(10))
    assert [r["phase"] for r in logged] == ["first"] * 6 + ["resume"] * 4
    assert [r["values"]["loss"] for r in logged] == losses
    config = records(tmp_path / "recorder.rank0.jsonl")[0]["config"]
    assert config == {"lr": 0.1, "dtype": "torch.float32", "out": str(tmp_path)}
    for r in (0, 1):  # a main_process_only=False tracker runs on every rank, with the same steps
        every = [x for x in records(tmp_path / f"every_rank.rank{r}.jsonl") if "step" in x]
        assert [(x["step"], x["values"]) for x in every] == [(x["step"], x["values"]) for x in logged]

    board = EventAccumulator(str(tmp_path / "run"))
    board.Reload()
    scalars = [(e.step, e.value) for e in board.Scalars("loss")]
    assert [s for s, _ in scalars] == list(range(10))
    assert all(math.isclose(v, loss, rel_tol=1e-6) for (_, v), loss in zip(scalars, losses))

    # One Chrome trace per rank, naming the model's ops.
    for r in (0, 1):
        trace = json.loads((tmp_path / "traces" / f"profile_{r}.json").read_text())
        assert {"aten::linear", "aten::relu"} <= {e.get("name") for e in trace["traceEvents"]}
