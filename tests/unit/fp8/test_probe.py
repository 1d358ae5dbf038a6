"""The fp8 capability probe: every device/package combination decided by the real code path on
mocked facts, the facts gathered from a mocked device and mocked imports, and the errors."""

from __future__ import annotations

import itertools
import logging
import sys
import types

import pytest

from accelerando.precision import fp8_probe
from accelerando.precision.fp8_probe import Fp8BackendUnavailable, Fp8Facts, choose_backend, missing

DEVICES = [
    ("cpu", None),
    ("cuda", (8, 0)),
    ("cuda", (8, 9)),
    ("cuda", (9, 0)),
    ("cuda", (7, 5)),
    ("xpu", None),
]
PACKAGE_SETS = [frozenset(c) for n in range(4) for c in itertools.combinations(("ao", "te", "msamp"), n)]
COMBINATIONS = [Fp8Facts(d, cap, pk) for (d, cap), pk in itertools.product(DEVICES, PACKAGE_SETS)]


def _id(f: Fp8Facts) -> str:
    cap = f"{f.capability[0]}{f.capability[1]}" if f.capability else ""
    return f"{f.device_type}{cap}-{'+'.join(sorted(f.importable)) or 'none'}"


# Hand-written decisions for the cases that matter (None: nothing can run).
EXPECTED = {
    ("cpu", None, ()): None,
    ("cpu", None, ("ao",)): "ao",
    ("cpu", None, ("ao", "te", "msamp")): "ao",  # TE / MS-AMP need CUDA
    ("cpu", None, ("te", "msamp")): None,
    ("cuda", (9, 0), ("ao", "te", "msamp")): "te",
    ("cuda", (9, 0), ("ao", "msamp")): "msamp",
    ("cuda", (9, 0), ("ao",)): "ao",
    ("cuda", (8, 9), ("ao", "te")): "te",
    ("cuda", (8, 0), ("ao", "te", "msamp")): "msamp",  # A100: no fp8 GEMMs, MS-AMP still runs
    ("cuda", (8, 0), ("ao", "te")): None,  # torchao's fp8 GEMMs need 8.9 too
    ("cuda", (7, 5), ("ao", "te", "msamp")): None,
    ("xpu", None, ("ao", "te", "msamp")): None,
}


@pytest.mark.parametrize(("device", "cap", "packages"), list(EXPECTED), ids=str)
def test_hand_checked_decisions(device: str, cap: tuple[int, int] | None, packages: tuple[str, ...]) -> None:
    facts = Fp8Facts(device, cap, frozenset(packages))
    want = EXPECTED[(device, cap, packages)]
    if want is None:
        with pytest.raises(Fp8BackendUnavailable, match="mixed_precision='fp8' cannot run here"):
            choose_backend(None, facts)
    else:
        assert choose_backend(None, facts) == want


@pytest.mark.parametrize("facts", COMBINATIONS, ids=_id)
def test_every_combination_picks_the_first_backend_that_can_run_or_names_what_each_lacks(
    facts: Fp8Facts,
) -> None:
    runnable = [b for b in fp8_probe.PREFERENCE if not missing(b, facts)]
    for backend in ("ao", "te", "msamp"):
        if backend in runnable:
            assert choose_backend(backend, facts) == backend
        else:
            with pytest.raises(Fp8BackendUnavailable) as err:
                choose_backend(backend, facts)  # asked for: never a fallback
            text = str(err.value)
            assert f"fp8 backend {backend!r}" in text and "cannot run here" in text
            assert all(reason in text for reason in missing(backend, facts))
    if runnable:
        assert choose_backend(None, facts) == runnable[0]
    else:
        with pytest.raises(Fp8BackendUnavailable) as err:
            choose_backend(None, facts)
        assert all(fp8_probe.NAMES[b] in str(err.value) for b in fp8_probe.PREFERENCE)
    # the facts' own rules: a backend lacking its package, or TE off CUDA, can never run
    for backend in ("ao", "te", "msamp"):
        if backend not in facts.importable:
            assert backend not in runnable
    if facts.device_type != "cuda":
        assert "te" not in runnable and "msamp" not in runnable


def test_the_reasons_name_the_package_the_device_and_the_capability() -> None:
    assert missing("te", Fp8Facts("cpu", None, frozenset())) == [
        "the 'transformer_engine' package (pip install 'transformer-engine[pytorch]' on a CUDA machine)",
        "a CUDA GPU (Transformer Engine runs only on CUDA; this is 'cpu')",
    ]
    assert missing("ao", Fp8Facts("cuda", (8, 0), frozenset({"ao"}))) == [
        "CUDA compute capability >= 8.9 for fp8 GEMMs (this GPU has 8.0)"
    ]
    assert missing("msamp", Fp8Facts("cuda", (9, 0), frozenset())) == [
        "the 'msamp' package (MS-AMP from source (github.com/Azure/MS-AMP); it is not on PyPI)"
    ]


def test_the_choice_is_logged_at_info_with_why_the_others_were_passed_over(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="accelerando.precision"):
        assert choose_backend(None, Fp8Facts("cpu", None, frozenset({"ao", "te"}))) == "ao"
    (line,) = [r.getMessage() for r in caplog.records if r.name == "accelerando.precision"]
    assert line.startswith("fp8: chose backend 'ao' (torchao) on cpu (te lacks")
    assert "msamp lacks the 'msamp' package" in line


def test_gather_facts_asks_the_device_and_really_imports(monkeypatch: pytest.MonkeyPatch) -> None:
    """Transformer Engine's meta package is found by find_spec but raises on import: not importable."""
    from accelerando.devices import cuda

    monkeypatch.setattr(cuda.CudaDevice, "compute_capability", lambda self, index=None: (9, 0))
    broken = types.ModuleType("transformer_engine")
    broken.__spec__ = __import__("importlib.machinery").machinery.ModuleSpec("transformer_engine", None)
    broken.__path__ = []  # a package, whose `pytorch` submodule cannot be imported
    monkeypatch.setitem(sys.modules, "transformer_engine", broken)
    facts = fp8_probe.gather_facts("cuda")
    assert facts.capability == (9, 0) and "te" not in facts.importable and "ao" in facts.importable
    assert fp8_probe.gather_facts("cpu", ("msamp",)) == Fp8Facts("cpu", None, frozenset())


def test_asking_the_accelerator_for_a_backend_that_cannot_run_here_names_what_is_missing() -> None:
    from accelerando import Accelerator, MSAMPRecipeKwargs, TERecipeKwargs

    with pytest.raises(
        Fp8BackendUnavailable, match=r"'te' \(Transformer Engine\) cannot run here: it needs the "
    ):
        Accelerator(cpu=True, mixed_precision="fp8", kwargs_handlers=[TERecipeKwargs()])
    with pytest.raises(Fp8BackendUnavailable, match=r"'msamp' \(MS-AMP\) cannot run here.*a CUDA GPU"):
        Accelerator(cpu=True, mixed_precision="fp8", kwargs_handlers=[MSAMPRecipeKwargs()])
