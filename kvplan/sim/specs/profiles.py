"""Shipped calibrated profiles: `--hardware cpu-local` simulates the engine a user can run on this kind of machine
(a 2-core CPU) with the profile `kvplan calibrate` measured there, instead of a roofline of a GPU."""

from __future__ import annotations

from pathlib import Path

from kvplan.errors import UserError
from kvplan.shipped import shipped_dir

PROFILES_DIR = shipped_dir("sim/profiles")  # the repository's sim/profiles/, installed as data files
PROFILED_DEVICES = ("cpu-local",)


def shipped_profiles(device: str) -> dict[str, Path]:
    """model name -> profile path, for every profile shipped for `device`."""
    return {p.stem: p for p in sorted((PROFILES_DIR / device).glob("*.yaml"))}


def shipped_profile(model: str, device: str = "cpu-local") -> Path:
    profiles = shipped_profiles(device)
    if model not in profiles:
        raise UserError(f"--hardware {device}: no shipped profile for model {model!r}; allowed: "
                         f"{', '.join(profiles) or 'none shipped'} (or --cost calibrated --profile P from "
                         "`kvplan calibrate`)")
    return profiles[model]


def profile_mismatch(profile_model: object, model: str) -> str | None:
    """Why a profile calibrated on `profile_model` misprices `model` (their shapes differ), or None when they
    agree or cannot be compared (a label such as `calibrate --from-replay --model my-server`)."""
    from kvplan.sim.specs.models import get_model

    if not isinstance(profile_model, str) or not profile_model or profile_model == model:
        return None
    try:
        measured, priced = get_model(profile_model), get_model(model)
    except ValueError:
        return None

    def shape(m) -> tuple[int, ...]:
        return m.num_layers, m.hidden_size, m.num_heads, m.num_kv_heads, m.head_dim, m.intermediate_size

    if shape(measured) == shape(priced):
        return None
    return (f"the profile was calibrated on {profile_model} ({measured.num_layers} layers, hidden "
            f"{measured.hidden_size}) but prices {model} ({priced.num_layers} layers, hidden {priced.hidden_size}): "
            f"its step times are the other model's; calibrate {model}, or simulate --model {profile_model}")
