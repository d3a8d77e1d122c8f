"""reference/metrics.md: every output metric - the summary every run writes (`results.summary.SUMMARY_KEYS`,
with the meanings of `SUMMARY_HELP`) and the columns of an experiment's runs.parquet and points.parquet
(`reference.columns`)."""

from __future__ import annotations

from kvplan.reference.cells import code, table
from kvplan.reference.columns import POINT_COLUMNS, PROBE_MEANINGS, RUN_COLUMNS, Column
from kvplan.results import summary


def column_rows(columns: tuple[Column, ...]) -> list[list[str]]:
    return [[c.name if c.name.startswith("(") else code(c.name), c.when, c.meaning] for c in columns]


def metrics_page() -> str:
    missing = [key for key in summary.SUMMARY_KEYS if key not in summary.SUMMARY_HELP]
    if missing:
        raise KeyError(f"reference/metrics.md: no meaning for the summary keys {missing} in SUMMARY_HELP")
    rows = [[code(key), *summary.SUMMARY_HELP[key]] for key in summary.SUMMARY_KEYS]
    lines = ["# Metrics", "",
             "Every metric kvplan writes, generated from the code that writes them when the docs are built. "
             "A run's `summary.json` holds the summary metrics, under vLLM's serving-benchmark names where "
             "vLLM has one; an experiment's `runs.parquet` has one row per run and `points.parquet` one row per "
             "point, with the columns below.", "",
             "## Summary metrics", "",
             f"The {len(summary.SUMMARY_KEYS)} keys of every summary (`kvplan/results/summary.py`), whoever served "
             "the trace (the simulator, the live engine, an endpoint). A steady-state probe measures them over "
             "its measurement window: latencies over the requests arriving inside it, throughput over the "
             "completions inside it, KV usage and the memory breakdown over the samples inside it, counters "
             "as their change across it.", "",
             *table(["metric", "unit", "meaning"], rows), "",
             "## runs.parquet", "",
             "One row per run: a point at a seed (and, for a search, at a probed value).", "",
             *table(["column", "present in", "meaning"], column_rows(RUN_COLUMNS)), "",
             f"{code('duration_s')} in runs.parquet: {PROBE_MEANINGS['duration_s']}.", "",
             "## points.parquet", "",
             "One row per point: its metrics at the answer, averaged over the seeds; for a search, the answer "
             "with its range over the seeds and over the cost model's error band.", "",
             *table(["column", "present in", "meaning"], column_rows(POINT_COLUMNS))]
    return "\n".join(lines).rstrip("\n") + "\n"
