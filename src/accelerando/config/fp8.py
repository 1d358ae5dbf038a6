"""Which fp8 backend was asked for, and its recipe with every field filled.

A recipe's unset fields come from the launcher (`accelerando launch --fp8_*`, or a config file's
`fp8_config` block, both exported as `ACCELERANDO_FP8_*`), else the backend's defaults. Pure
functions of the recipe and the parsed settings; whether the backend can run here is the capability
probe's question (`precision.fp8_probe`), asked once the device is known.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Union

from accelerando.config.env import EnvSettings
from accelerando.config.options import FP8_BACKENDS, AORecipeKwargs, MSAMPRecipeKwargs, TERecipeKwargs

Fp8Recipe = Union[AORecipeKwargs, TERecipeKwargs, MSAMPRecipeKwargs]
RECIPE_CLASSES: dict[str, type[Any]] = {
    "ao": AORecipeKwargs,
    "te": TERecipeKwargs,
    "msamp": MSAMPRecipeKwargs,
}
TE_DEFAULTS: dict[str, Any] = {
    "use_autocast_during_eval": False,
    "margin": 0,
    "interval": 1,
    "fp8_format": "HYBRID",
    "amax_history_len": 1024,
    "amax_compute_algo": "most_recent",
    "override_linear_precision": (False, False, False),
}
MSAMP_DEFAULT_OPT_LEVEL = "O2"


def requested_backend(recipe: Fp8Recipe | None, settings: EnvSettings) -> str | None:
    """The backend the script's recipe or the launcher names (None: let the probe choose)."""
    launcher = settings.fp8_backend
    if launcher is not None and launcher not in FP8_BACKENDS:
        raise ValueError(
            f"fp8 backend {launcher!r} (ACCELERANDO_FP8_BACKEND) is unknown; accepted: {', '.join(FP8_BACKENDS)}"
        )
    if recipe is not None and launcher is not None and recipe.backend != launcher:
        raise ValueError(
            f"the script passed {type(recipe).__name__} (fp8 backend {recipe.backend!r}) but the launcher asks "
            f"for fp8 backend {launcher!r} (ACCELERANDO_FP8_BACKEND); use one backend"
        )
    return recipe.backend if recipe is not None else launcher


def complete_recipe(backend: str, recipe: Fp8Recipe | None, settings: EnvSettings) -> Fp8Recipe:
    """`recipe` (or a new one for `backend`) with each unset field taken from the launcher or the default."""
    cls = RECIPE_CLASSES[backend]
    recipe = recipe if recipe is not None else cls()
    launcher = {
        f.name: getattr(settings, "fp8_" + f.name.removeprefix("fp8_"), None)
        for f in dataclasses.fields(recipe)
    }
    defaults = (
        TE_DEFAULTS
        if backend == "te"
        else {"opt_level": MSAMP_DEFAULT_OPT_LEVEL}
        if backend == "msamp"
        else {}
    )
    filled = {}
    for f in dataclasses.fields(recipe):
        value = getattr(recipe, f.name)
        if value is None:
            value = launcher[f.name] if launcher[f.name] is not None else defaults.get(f.name)
        filled[f.name] = value
    return cls(**filled)  # type: ignore[no-any-return]


@dataclasses.dataclass(frozen=True)
class Fp8Request:
    """What `mixed_precision="fp8"` resolved to: the backend asked for (None: the probe picks) and the
    completed recipe of every backend it may pick."""

    requested: str | None
    recipes: dict[str, Fp8Recipe]


def resolve_fp8(recipe: Fp8Recipe | None, settings: EnvSettings) -> Fp8Request:
    backend = requested_backend(recipe, settings)
    backends = (backend,) if backend is not None else FP8_BACKENDS
    return Fp8Request(backend, {b: complete_recipe(b, recipe, settings) for b in backends})
