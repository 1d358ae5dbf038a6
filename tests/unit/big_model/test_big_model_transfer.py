"""Loader threads and pinned-chunk copies: same tensors as a plain load, in order, buffers reused safely."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from bigmodel_toys import Toy, inputs, reference
from huggingface_hub import save_torch_state_dict
from safetensors.torch import save_file
from streams_double import StreamedCpu

import accelerando.big_model.loading as loading
import accelerando.big_model.transfer as transfer
from accelerando.big_model.offload import safetensors_spans
from accelerando.big_model.transfer import DeviceTransfers, FileSpan, StagedCopier, Transfer
from accelerando.big_modeling import init_empty_weights
from accelerando.devices.cpu import CpuDevice
from accelerando.utils.modeling import load_checkpoint_in_model

CPU = torch.device("cpu")


def odd_tensors() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    return {
        "f32": torch.randn(7, 13, generator=gen),
        "bf16": torch.randn(33, generator=gen).to(torch.bfloat16),
        "i64": torch.randint(-(2**40), 2**40, (5, 3), generator=gen),
        "flags": torch.rand(11, generator=gen) > 0.5,
        "scalar": torch.tensor(2.5),
        "empty": torch.empty(0, 4),
    }


def test_copier_reads_file_spans_and_tensors_across_chunk_edges(tmp_path: Path) -> None:
    tensors = odd_tensors()
    save_file(tensors, tmp_path / "t.safetensors")
    spans = safetensors_spans(str(tmp_path / "t.safetensors"))
    copier = StagedCopier(CpuDevice(), chunk_bytes=7, buffers=2)  # 7 bytes: every tensor spans chunks
    for name, tensor in tensors.items():
        from_file = torch.empty_like(tensor)
        from_tensor = torch.empty_like(tensor)
        if tensor.numel():
            copier.copy_into(from_file, FileSpan(str(tmp_path / "t.safetensors"), *spans[name]), None)
            copier.copy_into(from_tensor, tensor, None)
        assert torch.equal(from_file, tensor) and torch.equal(from_tensor, tensor), name
    copier.close()
    with pytest.raises(ValueError, match="holds 4 bytes but the destination needs 8"):
        copier.copy_into(torch.empty(2), torch.zeros(1), None)
    with pytest.raises(OSError, match="file ends before byte"):
        copier.copy_into(torch.empty(4), FileSpan(str(tmp_path / "t.safetensors"), 1 << 20, 16), None)


def test_copier_refills_a_buffer_only_after_its_transfer_event() -> None:
    device = StreamedCpu()
    stream = device.new_stream(CPU)
    copier = StagedCopier(device, chunk_bytes=8, buffers=2)
    source = torch.arange(10, dtype=torch.float32)  # 40 bytes: 5 chunks through 2 buffers
    dest = torch.empty_like(source)
    copier.copy_into(dest, source, stream)
    assert torch.equal(dest, source)
    records = [entry[2] for entry in device.log if entry[0] == "record"]
    syncs = [entry[1] for entry in device.log if entry[0] == "sync"]
    assert len(records) == 5  # one event per chunk
    assert syncs == records[:3]  # chunk k waits for chunk k-2's transfer (same buffer), in order
    for sync_at, event in ((device.log.index(("sync", e)), e) for e in syncs):
        recorded_at = next(
            i for i, entry in enumerate(device.log) if entry[:1] == ("record",) and entry[2] == event
        )
        assert recorded_at < sync_at


def test_device_transfers_give_tensors_in_submission_order() -> None:
    gen = torch.Generator().manual_seed(0)
    sources = [torch.randn(n, 3, generator=gen) for n in range(1, 40)]
    wide = torch.randn(6, 4, generator=gen).t()  # not contiguous: copied the way .to() copies it
    pool = DeviceTransfers(workers=3, chunk_bytes=16)
    for source in sources:
        pool.submit(Transfer(source, tuple(source.shape), torch.float32, CPU))
    pool.submit(Transfer(sources[0].double(), tuple(sources[0].shape), torch.float32, CPU))  # host cast
    pool.submit(Transfer(wide, tuple(wide.shape), torch.float32, CPU))
    got = list(pool.results())
    assert [g.shape for g in got[: len(sources)]] == [s.shape for s in sources]
    assert all(torch.equal(g, s) for g, s in zip(got, sources))
    assert got[-2].dtype == torch.float32 and torch.equal(got[-2], sources[0])
    assert torch.equal(got[-1], wide) and got[-1].stride() == wide.stride()


def load(folder: Path, streamed: bool, monkeypatch: pytest.MonkeyPatch, **kwargs: object) -> Toy:
    """Load through today's cpu route, or with every cpu tensor sent through the loader threads."""
    with monkeypatch.context() as patch:
        if streamed:
            patch.setattr(loading, "_streamed_device", lambda d: None if d in ("disk", "meta") else CPU)
            patch.setattr(transfer, "CHUNK_BYTES", 24)
        with init_empty_weights():
            model = Toy(tie=bool(kwargs.pop("tie", False)))
        load_checkpoint_in_model(model, folder, **kwargs)  # type: ignore[arg-type]
    return model


@pytest.mark.parametrize("kind", ["safetensors", "bin"])
def test_streamed_loading_equals_the_plain_route(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    ref = reference()
    state = ref.state_dict()
    state["blocks.1.up.weight"] = state["blocks.1.up.weight"].double()  # needs a cast on the way
    if kind == "bin":
        torch.save(state, tmp_path / "pytorch_model.bin")
    else:
        save_torch_state_dict(state, tmp_path, max_shard_size=2000)
    reserved: list[dict] = []
    monkeypatch.setattr(DeviceTransfers, "reserve", lambda self, totals: reserved.append(totals))
    for options in ({}, {"dtype": torch.float16, "keep_in_fp32_modules": ["head"]}):
        plain = load(tmp_path, False, monkeypatch, **options)
        streamed = load(tmp_path, True, monkeypatch, **options)
        for (name, a), (other, b) in zip(plain.named_parameters(), streamed.named_parameters()):
            assert name == other and type(a) is type(b) and a.requires_grad == b.requires_grad
            assert a.dtype == b.dtype and torch.equal(a, b), name
        for (name, a), (_, b) in zip(plain.named_buffers(), streamed.named_buffers()):
            assert a.dtype == b.dtype and torch.equal(a, b), name
        if not options:
            assert torch.equal(streamed(inputs()), plain(inputs()))
    fp32_bytes = sum(t.numel() * 4 for t in reference().state_dict().values()) + 4 * 8  # + table
    assert reserved[:2] == [{}, {CPU: fp32_bytes}]  # plain route: nothing bound for an accelerator


def test_streamed_loading_keeps_ties_and_refuses_bad_shapes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = reference(tie=True)
    save_file(
        {k: v for k, v in ref.state_dict().items() if k != "head.weight"}, tmp_path / "model.safetensors"
    )
    model = load(tmp_path, True, monkeypatch, tie=True)
    assert model.head.weight is model.embed.weight
    assert torch.equal(model(inputs()), ref(inputs()))
    save_file(reference(dim=4).state_dict(), tmp_path / "model.safetensors")
    with pytest.raises(
        ValueError, match="'blocks.0.down.bias' has shape \\(4,\\) but the model expects \\(8,\\)"
    ):
        load(tmp_path, True, monkeypatch)


def test_only_accelerators_with_streams_are_streamed(monkeypatch: pytest.MonkeyPatch) -> None:
    for value in ("cpu", "disk", "meta", CPU):
        assert loading._streamed_device(value) is None
    if not torch.cuda.is_available():
        assert loading._streamed_device("cuda:1") is None  # no streams to queue on: plain .to()
    monkeypatch.setattr(transfer, "get_device", lambda kind: StreamedCpu())  # a backend with streams
    assert loading._streamed_device("cuda:1") == torch.device("cuda", 1)
    assert loading._streamed_device(torch.device("xpu", 0)) == torch.device("xpu", 0)


class _Allocator:
    """What `Device.reserve_memory` reads from a backend module, with chosen numbers."""

    def __init__(self, free: int, reserved: int, allocated: int) -> None:
        self.numbers = (free, reserved, allocated)

    def current_device(self) -> int:
        return 0

    def mem_get_info(self, index: int) -> tuple[int, int]:
        return self.numbers[0], 1 << 40

    def memory_reserved(self, index: int) -> int:
        return self.numbers[1]

    def memory_allocated(self, index: int) -> int:
        return self.numbers[2]


@pytest.mark.parametrize(
    ("free", "reserved", "allocated", "taken"),
    [(10_000, 300, 200, 5_000), (10_000, 9_000, 1_000, 0), (2_000, 3_000, 1_000, 3_000)],
    ids=["fresh block", "cache already holds it", "capped by free + cached, less the margin"],
)
def test_reserve_memory_warms_the_allocator_with_what_is_missing(
    monkeypatch: pytest.MonkeyPatch, free: int, reserved: int, allocated: int, taken: int
) -> None:
    import accelerando.devices.base as base

    class Backend(base.Device):
        type = "cpu"  # the block is allocated (and dropped) on the host here

        def module(self) -> _Allocator:
            return _Allocator(free, reserved, allocated)

    monkeypatch.setattr(base, "_RESERVE_MARGIN", 1_000)
    assert Backend().reserve_memory(5_000, CPU) == taken
    assert CpuDevice().reserve_memory(5_000, CPU) == 0 and CpuDevice().new_stream(CPU) is None
    assert CpuDevice().pinned_empty(64).shape == (64,)
