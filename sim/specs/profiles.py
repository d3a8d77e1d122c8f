"""Shipped calibrated profiles: `--hardware cpu-local` simulates the engine a user can run on this kind of machine
(a 2-core CPU) with the profile `kvplan calibrate` measured there, instead of a roofline of a GPU."""

from __future__ import annotations

from pathlib import Path

PROFILES_DIR = Path(__file__).resolve().parents[1] / "profiles"
PROFILED_DEVICES = ("cpu-local",)


def shipped_profiles(device: str) -> dict[str, Path]:
    """model name -> profile path, for every profile shipped for `device`."""
    return {p.stem: p for p in sorted((PROFILES_DIR / device).glob("*.yaml"))}


def shipped_profile(model: str, device: str = "cpu-local") -> Path:
    profiles = shipped_profiles(device)
    if model not in profiles:
        raise ValueError(f"--hardware {device}: no shipped profile for model {model!r}; allowed: "
                         f"{', '.join(profiles) or 'none shipped'} (or --cost calibrated --profile P from "
                         "`kvplan calibrate`)")
    return profiles[model]
