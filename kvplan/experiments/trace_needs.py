"""What an experiment compares that its workload cannot show: one warning line before any run.

The simulator shares KV blocks between requests only through prefix hashes (`Trace.hash_ids`: Mooncake's and
Qwen-Bailian's `hash_ids`, kvplan's own `prefix_hashes`, a synthetic spec's `prefix:` section). A request without
them gets block keys salted with its own id (`engine.core.block_keys.HashBlockKeys`), so it can hit only its own
blocks (after a preemption), never another request's; session ids group a conversation's turns for the steady
population but share no block by themselves. On such a workload, prefix caching on and off, two eviction
policies, a prefix tier below the GPU or the prefix-aware router differ only by noise - an answer that looks
like a finding. The warning names what is compared, what the workload lacks and what to use instead.
"""

from __future__ import annotations

import json
from pathlib import Path

from kvplan.engine.core.settings import CPU_TIER, LOWER_TIER, SETTINGS, SHARED_TIER
from kvplan.experiments.points import Point
from kvplan.experiments.schema import Experiment
from kvplan.traces.schema import NO_VALUE

PREFIX_ROUTER = "prefix_aware"
ADVICE = ("use a trace with prefix hashes (Mooncake or Qwen-Bailian hash_ids, kvplan-jsonl prefix_hashes) or "
          "workload.synthetic with a prefix: section (`kvplan trace synth --help`)")


def prefix_settings() -> tuple[str, ...]:
    """The engine settings that act on shared prefixes only: prefix caching, which cached block is reused first,
    and every prefix tier below the GPU (what configures one and every option of one), from their declarations."""
    tier_options = {s.name for s in SETTINGS.values() if s.needs in (CPU_TIER, LOWER_TIER, SHARED_TIER)}
    tiers = {name for name, _ in LOWER_TIER.any_of}
    return ("enable_prefix_caching", "eviction_policy", *sorted(tiers | tier_options))


def compared(exp: Experiment, points: list[Point]) -> list[str]:
    """What the experiment's answer depends on that moves only with prefix sharing, as key paths: a prefix setting
    the sweep varies, a prefix tier any point configures, the prefix-aware router, an objective on prefix hits."""
    found: list[str] = []
    prefix = prefix_settings()
    for axes in (exp.sweep_grid, exp.sweep_zip):
        for key, values in axes.items():
            differ = len({json.dumps(v, sort_keys=True) for v in values}) > 1
            if differ and key.removeprefix("engine.") in prefix and key.startswith("engine."):
                found.append(key)
    tiers = {f"engine.{name}" for name, _ in LOWER_TIER.any_of}
    if not tiers & set(found) and any(LOWER_TIER.met(p.config["engine"]) for p in points):
        found.append("a prefix tier below the GPU")
    if any(p.config["cluster"]["router"] == PREFIX_ROUTER for p in points):
        found.append(f"cluster.router {PREFIX_ROUTER}")
    if exp.objective["metric"].startswith("prefix_cache"):
        found.append(f"objective {exp.objective['metric']}")
    return list(dict.fromkeys(found))


def shown(path: str) -> str:
    """A trace path as short as it is unambiguous: relative to the working directory when under it."""
    try:
        return str(Path(path).relative_to(Path.cwd()))
    except ValueError:
        return path


def prefix_warning(exp: Experiment, points: list[Point], trace) -> str | None:  # trace: the workload as built
    """The warning line (without its `warning: ` prefix) when the experiment compares what only prefix sharing
    moves and `trace` (the workload as a run builds it, transforms applied) carries no prefix hashes; else None."""
    if trace.has_prefix:
        return None
    what = compared(exp, points)
    if not what:
        return None
    workload = exp.base["workload"]
    if "trace" in workload:
        source = f"workload.trace {shown(workload['trace'])}"
        sessions = bool((trace.session_id != NO_VALUE).any()) if len(trace) else False
        lacks = ("no prefix hashes (hash_ids / prefix_hashes); its session ids alone share no KV block" if sessions
                 else "no prefix hashes (hash_ids / prefix_hashes) and no session ids")
    else:
        source, lacks = "workload.synthetic", "no prefix: section, so no prefix hashes"
    return (f"the experiment compares {', '.join(what)}, but {source} has {lacks}: no two requests share a prefix "
            f"in the simulator, so what it compares cannot show; {ADVICE}")
