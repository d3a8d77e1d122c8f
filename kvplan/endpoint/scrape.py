"""Read a server's Prometheus `/metrics` (text exposition format) under the metric names of its kind
(`servers.ADAPTERS`): gauges sampled during a replay, counters differenced over it, and the KV facts of
`vllm:cache_config_info`.

Servers that expose none of these (a plain OpenAI-compatible proxy) still replay; what could not be read is
reported as unknown (null), never as 0.

Distrust: a value is checked against its meaning before it is used. A gauge of KV usage is a fraction in [0, 1]
(50.0 is a percentage or garbage, not 50x full); a gauge of requests (running, waiting, swapped) is a whole count
>= 0 and at most MAX_GAUGE_COUNT (a negative count is not "idle"); a counter only grows, from >= 0; prefix-cache
hits over a run are at most its lookups (a hit rate of 50 is impossible). A sample that breaks one is excluded
(NaN: unknown for that key) and counted as the server's fault (`read_gauges`, `check_counters`); the run goes
on, and the result says how many were excluded and why.
"""

from __future__ import annotations

import math
import re

from kvplan.endpoint.http_limits import ServerFault, bad_value

# The summary keys read from counters (differenced between the start and the end of a replay) and the series
# columns read from gauges; which metric names fill each is the server's (`servers.ADAPTERS`), and a key the
# server has no metric for stays unknown.
COUNTER_KEYS = ("prefix_cache_queries", "prefix_cache_hits", "num_preemptions", "generation_tokens",
                "prompt_tokens", "request_success",
                # latency histograms' sums and counts (cumulative too): the engine's own TTFT, which the API
                # server's latency is fitted against (endpoint.frontend_fit)
                "queue_time_s_sum", "queue_time_count", "prefill_time_s_sum", "prefill_time_count",
                "server_ttft_s_sum", "server_ttft_count")
GAUGE_KEYS = ("running", "waiting", "swapped", "kv_usage")
FRACTION_GAUGES = ("kv_usage",)
MAX_GAUGE_COUNT = 10_000_000  # requests a server holds at once: more than any server's memory holds

_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample line; comments and malformed lines are skipped."""
    out = []
    for line in text.splitlines():
        match = _LINE.match(line)
        if not match or line.startswith("#"):
            continue
        try:
            value = float(match.group(4))
        except ValueError:
            continue
        labels = dict(_LABEL.findall(match.group(3) or ""))
        out.append((match.group(1), labels, value))
    return out


def _sum(samples: list, name: str) -> float:
    values = [v for n, _, v in samples if n == name]
    return math.fsum(values) if values else math.nan


def first(samples: list, names: tuple[str, ...]) -> float:
    """The sum of the first of `names` the server exposes, NaN when it exposes none."""
    return next((v for v in (_sum(samples, n) for n in names) if not math.isnan(v)), math.nan)


def read(samples: list, keys: tuple[str, ...], names: dict[str, tuple[str, ...]]) -> dict[str, float]:
    """Each of `keys` from the first of its metric `names` the server exposes; NaN where it has none."""
    return {key: first(samples, names.get(key, ())) for key in keys}


def cache_config(samples: list) -> dict[str, str]:
    """The labels of `vllm:cache_config_info` (block_size, num_gpu_blocks, enable_prefix_caching, ...), or {}."""
    return next((labels for name, labels, _ in samples if name == "vllm:cache_config_info"), {})


def difference(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """after − before; a counter absent before but present after started during the run (a labelled series
    appears at its first increment), so it counts from 0. A counter only grows: one that went down (the server
    restarted mid-replay) or is negative or infinite (a broken exporter) is unknown (NaN), never a negative or
    infinite count in the summary; `broken` names them."""
    return {key: _delta(before[key], after[key]) for key in after}


def broken(before: dict[str, float], after: dict[str, float]) -> list[str]:
    """The counters `difference` reports as unknown although the server exposed them, with their two values."""
    return [f"{key} ({before[key]:g} -> {after[key]:g})" for key in after
            if not math.isnan(after[key]) and math.isnan(_delta(before[key], after[key]))]


def _delta(start: float, end: float) -> float:
    start = 0.0 if math.isnan(start) else start
    value = end - start
    if math.isnan(end) or start < 0 or not math.isfinite(start) or not math.isfinite(value) or value < 0:
        return math.nan
    return value


def read_gauges(samples: list, names: dict[str, tuple[str, ...]], where: str
                ) -> tuple[dict[str, float], list[ServerFault]]:
    """Each gauge column from the first of its metric `names` the server exposes (NaN where none), every sample
    of it checked against its meaning (module doc): a fraction is the mean over its label sets (one per engine of
    a data-parallel server), a count their sum. A bad sample makes the column NaN (excluded) and is returned as a
    fault naming the metric and the value; a NaN sample is the server saying "unknown", and is."""
    values, faults = dict.fromkeys(GAUGE_KEYS, math.nan), []
    for key in GAUGE_KEYS:
        for name in names.get(key, ()):
            found = [v for n, _, v in samples if n == name]
            if not found:
                continue
            fraction = key in FRACTION_GAUGES
            bad = next((v for v in found if not _meaningful(v, fraction)), None)
            if bad is not None:
                expected = ("a fraction in [0, 1]" if fraction
                            else f"a whole count of requests in [0, {MAX_GAUGE_COUNT}]")
                faults.append(bad_value(where, name, bad, expected))
            elif not any(math.isnan(v) for v in found):
                values[key] = math.fsum(found) / len(found) if fraction else math.fsum(found)
            break
    return values, faults


def _meaningful(value: float, fraction: bool) -> bool:
    if math.isnan(value):
        return True
    if fraction:
        return 0.0 <= value <= 1.0
    return 0 <= value <= MAX_GAUGE_COUNT and value.is_integer()


def check_counters(before: dict[str, float], after: dict[str, float], delta: dict[str, float],
                   where: str, names: dict[str, tuple[str, ...]]) -> list[ServerFault]:
    """The counters' differences against their meaning: a counter `difference` found broken (backwards,
    negative, infinite), and prefix-cache hits beyond lookups (both set to NaN in `delta`); each a fault."""
    faults = [bad_value(where, " or ".join(names.get(key, (key,))), f"{before[key]:g} -> {after[key]:g}",
                        "a counter that grows from >= 0")
              for key in after if not math.isnan(after[key]) and math.isnan(delta[key])]
    hits, queries = delta.get("prefix_cache_hits", math.nan), delta.get("prefix_cache_queries", math.nan)
    if hits > queries:  # False when either is NaN
        faults.append(bad_value(where, " and ".join(names.get("prefix_cache_hits", ())
                                                    + names.get("prefix_cache_queries", ())),
                                f"{hits:g} hits in {queries:g} lookups", "at most one hit per lookup"))
        delta["prefix_cache_hits"] = delta["prefix_cache_queries"] = math.nan
    return faults
