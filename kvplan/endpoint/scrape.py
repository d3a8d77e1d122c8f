"""Read a server's Prometheus `/metrics` (text exposition format) under vLLM's or llama.cpp's metric names: gauges
sampled during a replay, counters differenced over it, and the KV facts of `vllm:cache_config_info`.

Servers that expose none of these (a plain OpenAI-compatible proxy) still replay; what could not be read is
reported as unknown (null), never as 0.
"""

from __future__ import annotations

import math
import re

# (summary key, counters to try): vLLM's name first, then llama.cpp's (names read from the vendored llama.cpp
# server source, tools/server/server-task.cpp, which prefixes each with "llamacpp:"); each summed over label sets,
# differenced between the start and the end of a replay. llama.cpp counts cached prompt tokens but not lookups, so
# its prefix_cache_queries stays unknown rather than borrowed from another counter.
COUNTERS = (("prefix_cache_queries", ("vllm:prefix_cache_queries_total",)),
            ("prefix_cache_hits", ("vllm:prefix_cache_hits_total", "llamacpp:prompt_tokens_cached_total")),
            ("num_preemptions", ("vllm:num_preemptions_total",)),
            ("generation_tokens", ("vllm:generation_tokens_total", "llamacpp:tokens_predicted_total")),
            ("prompt_tokens", ("vllm:prompt_tokens_total", "llamacpp:prompt_tokens_total")),
            ("request_success", ("vllm:request_success_total",)))
# series column -> gauges to try, newest vLLM name first, then llama.cpp's (busy slots, requests deferred for
# want of a free slot); llama.cpp exports no KV-usage gauge, so kv_usage stays unknown against it
GAUGES = (("running", ("vllm:num_requests_running", "llamacpp:requests_processing")),
          ("waiting", ("vllm:num_requests_waiting", "llamacpp:requests_deferred")),
          ("swapped", ("vllm:num_requests_swapped",)),
          ("kv_usage", ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")))

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


def counters(samples: list) -> dict[str, float]:
    return {key: first(samples, names) for key, names in COUNTERS}


def gauges(samples: list) -> dict[str, float]:
    return {key: first(samples, names) for key, names in GAUGES}


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
