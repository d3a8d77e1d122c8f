"""Points and runs: what an experiment expands into.

    experiment --sweep--> points (configurations) --seeds, search probes--> runs (one simulation each)

A point is the base configuration with the sweep's values set (the grid's cross product, then each zipped row).
A run is a point at one seed, and for a search at one probed rate scale or replica count. A run is identified by
the content hash of everything that determines its result: the resolved configuration, the digest of the
trace file (or the synthetic spec) and of a calibrated profile, and the kvplan version. Equal hashes mean equal
results, which is what lets `--resume` skip finished runs.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from kvplan import __version__
from kvplan.experiments.pd_block import KEY as PD_KEY
from kvplan.experiments.pd_block import hidden, label_part
from kvplan.experiments.schema import Experiment
from kvplan.ownership import file_sha256
from kvplan.sim.specs.profiles import PROFILED_DEVICES, shipped_profile


@dataclass(slots=True)
class Point:
    index: int
    label: str  # the swept values, "block_size=16 eviction_policy=lru" ("base" without a sweep)
    values: dict[str, object]  # dotted key -> value set by the sweep
    config: dict  # the resolved configuration (no seed)


def set_path(doc: dict, dotted: str, value: object) -> None:
    *parents, leaf = dotted.split(".")
    for key in parents:
        doc = doc[key]
    doc[leaf] = value


def get_path(doc: dict, dotted: str) -> object:
    for key in dotted.split("."):
        doc = doc[key]
    return doc


def expand(exp: Experiment) -> list[Point]:
    """Every point of the experiment, in a stable order: the grid varies its last key fastest."""
    grid = [dict(zip(exp.sweep_grid, row, strict=True)) for row in itertools.product(*exp.sweep_grid.values())]
    rows = len(next(iter(exp.sweep_zip.values()))) if exp.sweep_zip else 1
    zipped = [{k: v[i] for k, v in exp.sweep_zip.items()} for i in range(rows)]
    points = []
    for values in ({**g, **z} for g in grid for z in zipped):
        config = copy.deepcopy(exp.base)
        for key, value in values.items():
            set_path(config, key, value)
        label = " ".join(label_part(key, value) for key, value in values.items()
                         if not hidden(key, value, values.get(PD_KEY))) or "base"
        points.append(Point(len(points), label, values, config))
    return points


def run_config(config: dict, seed: int, probe: dict[str, object] | None = None) -> dict:
    """A run's configuration: the point's at `seed`, with a search's probed value (dotted key -> value)."""
    out = copy.deepcopy(config)
    for key, value in (probe or {}).items():
        set_path(out, key, value)
    out["seed"] = seed
    return out


@cache
def file_digest(path: str) -> str:
    return file_sha256(path)


def run_key(config: dict) -> str:
    """The content hash of a run: its configuration with every referenced file replaced by its digest."""
    identity = copy.deepcopy(config)
    workload = identity["workload"]
    if "trace" in workload:
        workload["trace"] = file_digest(workload["trace"])
    if identity["hardware"].endswith((".yaml", ".yml")):
        identity["hardware"] = file_digest(identity["hardware"])
    elif identity["hardware"] in PROFILED_DEVICES:  # the shipped profile the simulator will use
        identity["profile"] = file_digest(str(shipped_profile(identity["model"], identity["hardware"])))
    if Path(identity["model"]).exists():
        identity["model"] = file_digest(str(Path(identity["model"]) / "config.json")
                                        if Path(identity["model"]).is_dir() else identity["model"])
    text = json.dumps({"kvplan": __version__, "run": identity}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]
