"""Which fp8 backend can run here: facts about the machine, then one decision that says why.

`gather_facts` is the only impure part (it asks the device for its compute capability and tries
the imports); `missing` and `choose_backend` are pure functions of the facts, so every
device/package combination is tested without the hardware. Asking for a backend that cannot run is
an error naming what is missing; there is no silent fallback to another backend or to bf16.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
from dataclasses import dataclass

logger = logging.getLogger("accelerando.precision")

# The import each backend needs, and its name for people.
PACKAGES = {"ao": "torchao", "te": "transformer_engine.pytorch", "msamp": "msamp"}
NAMES = {"ao": "torchao", "te": "Transformer Engine", "msamp": "MS-AMP"}
INSTALL = {
    "ao": "pip install 'accelerando[fp8]' (torchao)",
    "te": "pip install 'transformer-engine[pytorch]' on a CUDA machine",
    "msamp": "MS-AMP from source (github.com/Azure/MS-AMP); it is not on PyPI",
}
PREFERENCE = ("te", "msamp", "ao")  # a dedicated fp8 engine where one runs; torchao runs nearly anywhere
FP8_GEMM_CAPABILITY = (8, 9)  # Ada / Hopper and newer: fp8 tensor cores (TE, torch._scaled_mm)
MSAMP_CAPABILITY = (8, 0)  # MS-AMP supports A100 and H100


class Fp8BackendUnavailable(ValueError):
    """The fp8 backend asked for (or every backend) cannot run on this machine."""


@dataclass(frozen=True)
class Fp8Facts:
    device_type: str  # "cpu", "cuda", "xpu", ...
    capability: tuple[int, int] | None  # CUDA compute capability, None elsewhere
    importable: frozenset[str]  # backends whose package imports here ("ao", "te", "msamp")


def _imports(module: str) -> bool:
    """Really import it: Transformer Engine's meta package is found by `find_spec` yet raises on import."""
    if importlib.util.find_spec(module.split(".")[0]) is None:
        return False
    try:
        importlib.import_module(module)
    except Exception:  # noqa: BLE001 - any failure to import means the backend cannot run
        return False
    return True


def gather_facts(device_type: str, backends: tuple[str, ...] = PREFERENCE) -> Fp8Facts:
    """This machine's facts, importing only the backends that may be chosen."""
    capability = None
    if device_type == "cuda":
        from accelerando.devices.registry import get_device

        capability = get_device("cuda").compute_capability()
    return Fp8Facts(device_type, capability, frozenset(b for b in backends if _imports(PACKAGES[b])))


def _cap(capability: tuple[int, int]) -> str:
    return f"{capability[0]}.{capability[1]}"


def missing(backend: str, facts: Fp8Facts) -> list[str]:
    """What `backend` lacks on this machine (empty: it can run)."""
    out = []
    if backend not in facts.importable:
        out.append(f"the {PACKAGES[backend].split('.')[0]!r} package ({INSTALL[backend]})")
    if backend == "ao":
        if facts.device_type not in ("cpu", "cuda"):
            out.append(
                f"a CPU or CUDA device (torchao fp8 training runs on those; this is {facts.device_type!r})"
            )
        elif facts.device_type == "cuda" and (facts.capability or (0, 0)) < FP8_GEMM_CAPABILITY:
            out.append(_capability_text(facts, FP8_GEMM_CAPABILITY))
        return out
    if facts.device_type != "cuda":
        out.append(f"a CUDA GPU ({NAMES[backend]} runs only on CUDA; this is {facts.device_type!r})")
        return out
    need = FP8_GEMM_CAPABILITY if backend == "te" else MSAMP_CAPABILITY
    if (facts.capability or (0, 0)) < need:
        out.append(_capability_text(facts, need))
    return out


def _capability_text(facts: Fp8Facts, need: tuple[int, int]) -> str:
    have = _cap(facts.capability) if facts.capability else "unknown"
    return f"CUDA compute capability >= {_cap(need)} for fp8 GEMMs (this GPU has {have})"


def choose_backend(requested: str | None, facts: Fp8Facts) -> str:
    """`requested` if it can run (else an error naming what it lacks); without a request, the first of
    PREFERENCE that can run, logged at INFO with why the others were passed over."""
    if requested is not None:
        lacks = missing(requested, facts)
        if lacks:
            raise Fp8BackendUnavailable(
                f"fp8 backend {requested!r} ({NAMES[requested]}) cannot run here: it needs "
                + " and ".join(lacks)
                + f". Device: {_device_text(facts)}. No fallback is made; ask for another backend "
                "(AORecipeKwargs / --fp8_backend ao) or another mixed_precision."
            )
        logger.info(
            "fp8: using backend %r (%s), as asked, on %s", requested, NAMES[requested], _device_text(facts)
        )
        return requested
    reasons = {b: missing(b, facts) for b in PREFERENCE}
    for backend in PREFERENCE:
        if not reasons[backend]:
            passed = "; ".join(
                f"{b} lacks {' and '.join(r)}" for b, r in reasons.items() if r and b != backend
            )
            logger.info(
                "fp8: chose backend %r (%s) on %s%s",
                backend,
                NAMES[backend],
                _device_text(facts),
                f" ({passed})" if passed else "",
            )
            return backend
    raise Fp8BackendUnavailable(
        f"mixed_precision='fp8' cannot run here ({_device_text(facts)}): "
        + "; ".join(f"{NAMES[b]} needs {' and '.join(r)}" for b, r in reasons.items())
    )


def _device_text(facts: Fp8Facts) -> str:
    if facts.device_type == "cuda":
        cap = _cap(facts.capability) if facts.capability else "unknown"
        return f"cuda (compute capability {cap})"
    return facts.device_type
