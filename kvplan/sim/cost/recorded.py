"""Engine step profiles (JSONL, written by `engine.profiler`) and the recorded cost model built from them.

`RecordedCost` prices simulated step i with live step i's measured duration (end − start on the trace clock):
the simulator then reproduces the live run's timing exactly, so any difference in token times is a difference
in policy. It also checks, step by step, that the simulated batch is the live one (same requests, same new
tokens, same start positions) and stops at the first step that differs, naming it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

import numpy as np

from kvplan.engine.core.settings import SETTINGS
from kvplan.engine.core.tier_transfers import num_demotions
from kvplan.errors import UserError
from kvplan.limits import MAX_BLOCKS, MAX_TOKENS
from kvplan.sim.cost.features import StepFeatures
from kvplan.strict_json import loads, short, whole, why


class PolicyDivergence(UserError):
    """The simulated scheduler did not schedule what the live engine scheduled: a configuration that differs from
    the replay's (a user error for `simulate --cost recorded`), or - with the replay's own configuration, as
    `kvplan validate` runs it - a policy difference between the simulator and the engine, which it reports."""


@dataclass(slots=True)
class ProfiledItem:
    """One scheduled request of a recorded step (the fields `step_features` reads, plus its id)."""

    request_id: str
    num_new_tokens: int
    start_pos: int
    is_decode: bool
    samples: bool
    spec_token_ids: tuple[int, ...] = ()  # speculative decoding: placeholders for the drafts the step verified


@dataclass(slots=True)
class ProfiledStep:
    step: int
    block_size: int
    items: list[ProfiledItem]
    swapped_blocks: int
    copied_blocks: int
    wall_s: float  # the engine's own step() time
    start_s: float | None = None  # on the trace clock (live replay only)
    end_s: float | None = None
    tier_moves: tuple[int, int] | None = None  # (promoted, demoted) prefix-tier blocks; None: an older profile
    # speculative decoding: request id -> (drafts verified, drafts accepted), for the requests that verified any
    spec: dict[str, tuple[int, int]] | None = None

    @property
    def duration_s(self) -> float:
        """The time a simulator must charge for this step: the replay's start-to-end when known."""
        return self.end_s - self.start_s if self.end_s is not None and self.start_s is not None else self.wall_s


def _flag(value: object, what: str) -> bool:
    if not isinstance(value, bool):  # bool("no") is True: a flag is written as true or false
        raise UserError(f"{what}: {short(value)}; allowed: true or false")
    return value


def _seconds(value: object, what: str) -> float:
    """A time of the step profile: a finite number >= 0."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise UserError(f"{what}: {short(value)}; allowed: a finite number of seconds >= 0")
    return float(value)


def _optional_seconds(value: object, what: str) -> float | None:
    """An optional time of the step profile: None where it is absent."""
    return None if value is None else _seconds(value, what)


def read_step_profile(path: str | Path) -> tuple[dict, list[ProfiledStep]]:
    """(meta, steps) of a step profile; a malformed line is an error naming the file and line."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such step profile")
    if not path.is_file():  # a directory, /dev/null, a FIFO (reading one would wait for a writer)
        raise UserError(f"{path}: not a regular file; allowed: the steps.jsonl that `kvplan replay` writes")
    meta: dict | None = None
    steps: list[ProfiledStep] = []
    with path.open("rb") as f:
        for number, line in enumerate(f, 1):
            try:
                # any JSON value: a record of another shape raises below and is reported with its line
                record: Any = loads(line)  # strict: NaN, Infinity, 1e400 and bytes that are not UTF-8 are refused
                if number == 1:
                    meta = _header(record["meta"])
                    continue
                items = [ProfiledItem(str(i[0]), whole(i[1], "num_new_tokens", 0, MAX_TOKENS),
                                      whole(i[2], "start_pos", 0, MAX_TOKENS), _flag(i[3], "is_decode"),
                                      _flag(i[4], "samples")) for i in record["items"]]
                count = {key: whole(record[key], key, *COUNTS.get(key, (0, MAX_BLOCKS)))
                         for key in ("step", "block_size", "num_swap_out", "num_swap_in", "num_copies")}
                steps.append(ProfiledStep(count["step"], count["block_size"], items,
                                          count["num_swap_out"] + count["num_swap_in"], count["num_copies"],
                                          _seconds(record["wall_s"], "wall_s"),
                                          _optional_seconds(record.get("start_s"), "start_s"),
                                          _optional_seconds(record.get("end_s"), "end_s"),
                                          _tier_moves(record), _spec(record, items)))
            except (ValueError, KeyError, TypeError, IndexError) as exc:
                what = "a {'meta': {...}} header" if number == 1 else "a step record"
                raise UserError(f"{path}:{number}: not {what} of an engine step profile ({why(exc)}); allowed: "
                                "the steps.jsonl that `kvplan replay` writes") from None
    if meta is None:
        raise UserError(f"{path}:1: empty step profile; allowed: a file written by the engine's step profiler")
    return meta, steps


# Bounds of a step record's numbers, as the engine that writes them has them (the settings' ranges); any other
# count of a step is of blocks.
MAX_BLOCK_SIZE = int(SETTINGS["block_size"].maximum or 0)
COUNTS: dict[str, tuple[int, int | None]] = {"step": (0, None), "block_size": (1, MAX_BLOCK_SIZE)}


def _header(meta: object) -> dict:
    """The header's fields the simulator prices with (the engine's block size and KV blocks), checked: a header
    without them is no profile of an engine run, and would be taken for one that has them at None."""
    if not isinstance(meta, dict):
        raise TypeError(f"meta is {short(meta)}, not an object")
    for key, (low, high) in (("block_size", COUNTS["block_size"]), ("num_blocks", (1, MAX_BLOCKS))):
        if key not in meta:
            raise KeyError(key)
        meta[key] = whole(meta[key], f"meta.{key}", low, high)
    return meta


def _spec(record: dict, items: list[ProfiledItem]) -> dict[str, tuple[int, int]] | None:
    """A step's verifications (speculative decoding), checked; each verifying item gets its drafts' placeholders
    (the LM head rows `step_features` counts)."""
    spec = record.get("spec")
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise TypeError(f"spec is {short(spec)}, not an object")
    out: dict[str, tuple[int, int]] = {}
    for rid, pair in spec.items():
        verified = whole(pair[0], "spec drafts", 0, MAX_TOKENS)
        out[rid] = (verified, whole(pair[1], "spec accepted", 0, verified))
    for item in items:
        if item.request_id in out:
            item.spec_token_ids = (0,) * out[item.request_id][0]
    return out


def _tier_moves(record: dict) -> tuple[int, int] | None:
    if "num_promotions" not in record:  # written before the engine had prefix tiers
        return None
    return whole(record["num_promotions"], "num_promotions", 0), whole(record["num_demotions"], "num_demotions", 0)


class RecordedCost:
    """Prices step i of a simulation with step i of a live replay's profile (a replay of the same trace)."""

    def __init__(self, steps: list[ProfiledStep], source: str = "profile") -> None:
        if any(s.start_s is None for s in steps):
            raise UserError(f"{source}: not the step profile of a live replay (steps lack start_s/end_s); "
                             "allowed: the steps.jsonl that `kvplan replay` writes")
        self.steps = {s.step: s for s in steps}
        self.source = source
        # speculative decoding: what each request's verifications accepted, in order
        accepted: dict[str, list[int]] = {}
        for s in steps:
            for rid, (_, kept) in (s.spec or {}).items():
                accepted.setdefault(rid, []).append(kept)
        self.recorded_acceptance: dict[str, list[int]] = accepted

    def recorded_step_time(self, step) -> float:
        live = self.steps.get(step.step_id)
        if live is None:
            raise PolicyDivergence(f"{self.source}: the simulation ran a step {step.step_id} the live run never "
                                   f"ran (it recorded {len(self.steps)} steps)")
        simulated = [(i.request_id, i.num_new_tokens, i.start_pos) for i in step.scheduled]
        recorded = [(i.request_id, i.num_new_tokens, i.start_pos) for i in live.items]
        if sorted(simulated) != sorted(recorded):
            extra = sorted(set(simulated) - set(recorded))[:3]
            missing = sorted(set(recorded) - set(simulated))[:3]
            raise PolicyDivergence(f"{self.source}: step {step.step_id} differs: the simulation scheduled "
                                   f"{extra} that the live run did not, and not {missing} that it did "
                                   "(request id, new tokens, start); allowed: the options the replay ran with "
                                   "(its engine.json)")
        if live.tier_moves is not None:
            moves = (len(step.promotions), num_demotions(step.tier_transfers))
            if moves != live.tier_moves:
                raise PolicyDivergence(f"{self.source}: step {step.step_id} differs: the simulation promoted and "
                                       f"demoted {moves} prefix-tier blocks, the live run {live.tier_moves}; "
                                       "allowed: the options the replay ran with (its engine.json)")
        return live.duration_s

    @overload
    def step_times(self, f: StepFeatures[int]) -> float: ...
    @overload
    def step_times(self, f: StepFeatures[np.ndarray]) -> np.ndarray: ...
    def step_times(self, f: StepFeatures) -> np.ndarray | float:
        raise TypeError("a recorded cost prices steps by their id, not their features: run without the fast path")

    def transfer_time(self, swapped_blocks: int, copied_blocks: int, disk_blocks: int = 0) -> float:
        return 0.0  # the recorded duration includes the step's swaps and copies
