"""Offload prefetch on a stream backend (its protocol checked on CPU): order, values, nothing held."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest
import torch
from bigmodel_toys import Toy, inputs, reference
from safetensors.torch import save_file
from streams_double import StreamedCpu

import accelerando.big_model.prefetch as prefetch
from accelerando.big_model.prefetch import StreamFetcher
from accelerando.big_modeling import init_empty_weights, load_checkpoint_and_dispatch
from accelerando.hooks import remove_hook_from_submodules

DISK_BLOCKS = {"embed": "cpu", "blocks": "disk", "head": "cpu", "scale": "cpu", "table": "cpu"}
PER_BLOCK = 6  # up, down, norm: weight and bias


class Recorder:
    """Streams every fetch through a logging stream backend and remembers what it handed out."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.device = StreamedCpu()
        # cpu:0 differs from the weights' "cpu", so the fetcher really copies them, as to an accelerator
        self.fetcher = StreamFetcher(self.device, torch.device("cpu", 0))
        self.handed: list[weakref.ref[torch.Tensor]] = []
        monkeypatch.setattr(prefetch, "fetcher_for", lambda device: self.fetcher)
        one, fetch, start = StreamFetcher._one, StreamFetcher._fetch, StreamFetcher.start

        def logged_one(fetcher: StreamFetcher, value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
            out = one(fetcher, value, dtype)
            assert out is not value
            self.handed.append(weakref.ref(out))
            return out

        def logged_fetch(fetcher: StreamFetcher, weights, names, dtypes):  # type: ignore[no-untyped-def]
            values, done = fetch(fetcher, weights, names, dtypes)
            self.device.log.append(("fetched", weights.prefix, done.id))
            return values, done

        def logged_start(fetcher: StreamFetcher, weights, names, dtypes):  # type: ignore[no-untyped-def]
            self.device.log.append(("start", weights.prefix))
            return start(fetcher, weights, names, dtypes)

        monkeypatch.setattr(StreamFetcher, "_one", logged_one)
        monkeypatch.setattr(StreamFetcher, "_fetch", logged_fetch)
        monkeypatch.setattr(StreamFetcher, "start", logged_start)

    def alive(self) -> int:
        prefetch._executor().submit(lambda: None).result()  # one worker: every queued prefetch has run
        gc.collect()
        return sum(ref() is not None for ref in self.handed)


def dispatched(folder: Path, device_map: dict | None = None) -> tuple[Toy, Toy]:
    ref = reference()
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, folder / "model.safetensors")
    with init_empty_weights():
        model = Toy()
    return load_checkpoint_and_dispatch(model, folder, device_map=device_map or DISK_BLOCKS), ref


def log_runs(model: Toy, log: list[tuple], names: list[str] | None = None) -> None:
    for name in names or [f"blocks.{i}" for i in range(4)]:
        module = model.get_submodule(name)
        inner = module._old_forward

        def run(x: torch.Tensor, name: str = name, inner=inner) -> torch.Tensor:  # type: ignore[no-untyped-def]
            log.append(("run", name))
            return inner(x)

        module._old_forward = run


def test_each_block_waits_for_its_event_and_the_next_is_already_on_its_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder = Recorder(monkeypatch)
    model, ref = dispatched(tmp_path)
    log = recorder.device.log
    log_runs(model, log)
    with torch.no_grad():
        assert torch.equal(model(inputs()), ref(inputs()))  # the copied weights are the stored ones
    where = {entry: i for i, entry in enumerate(log)}
    done: dict[str, int] = {}
    for entry in log:
        if entry[0] == "fetched":
            done.setdefault(entry[1], entry[2])  # block 0's second fetch is for the next call
    for i in range(4):
        prefix = f"blocks.{i}."
        assert where[("wait", "compute", done[prefix])] < where[("run", f"blocks.{i}")]  # event, no host sync
        if i < 3:
            assert where[("start", f"blocks.{i + 1}.")] < where[("run", f"blocks.{i}")]
    assert log.count(("start", "blocks.0.")) == 2  # block 0 once on demand, once ahead of the next call
    side = recorder.fetcher.stream.name
    copies = [entry for entry in log if entry[0] == "enter"]
    assert copies and all(entry == ("enter", side) for entry in copies)  # every copy on the side stream
    recorded = [entry for entry in log if entry[0] == "record_stream"]
    assert len(recorded) == 4 * PER_BLOCK and {entry[2] for entry in recorded} == {"compute"}
    assert not any(entry[0] == "stream-sync" for entry in log)  # the forward never waits on the host


def test_nothing_stays_on_the_device_but_the_next_calls_first_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder = Recorder(monkeypatch)
    model, ref = dispatched(tmp_path)
    with torch.no_grad():
        for _ in range(3):
            assert torch.equal(model(inputs()), ref(inputs()))
            assert recorder.alive() == PER_BLOCK  # block 0, fetched ahead for the next call
    assert all(p.device.type == "meta" for p in model.blocks.parameters())
    remove_hook_from_submodules(model)
    assert recorder.alive() == 0


def test_a_changed_dtype_is_fetched_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = Recorder(monkeypatch)
    model, ref = dispatched(tmp_path)
    with torch.no_grad():
        model(inputs())  # leaves block 0 prefetched as float32
        model.to(torch.float64)
        out = model(inputs())
    assert out.dtype == torch.float64
    assert torch.allclose(out, ref.double()(inputs()))
    assert recorder.alive() == PER_BLOCK


def test_small_blocks_do_not_hold_back_the_prefetch_of_larger_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder = Recorder(monkeypatch)
    # the chain is embed (512 B) -> blocks.0 (1184 B) -> head (512 B); one largest block = 1184 B ahead
    device_map = dict.fromkeys(["embed", "blocks.0", "head"], "disk")
    device_map |= dict.fromkeys(["blocks.1", "blocks.2", "blocks.3", "scale", "table"], "cpu")
    model, ref = dispatched(tmp_path, device_map)
    log = recorder.device.log
    log_runs(model, log, ["embed", "blocks.0", "head"])
    with torch.no_grad():
        assert torch.equal(model(inputs()), ref(inputs()))
    starts = [i for i, entry in enumerate(log) if entry == ("start", "embed.")]
    assert len(starts) == 2 and starts[1] < log.index(("run", "blocks.0"))  # two blocks ahead: 512 + 512 B
    assert recorder.alive() == 1 + PER_BLOCK  # embed and blocks.0 wait for the next call, nothing else
