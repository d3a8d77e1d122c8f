"""reference/schema.md: the experiment file, section by section, from the schema's own tables
(`kvplan.experiments.schema`): every key with its kind, default, what it allows and its help.

The schema module's docstring is the annotated example a user starts from; it opens the page as it is. The
sections below are its typed tables (ENGINE, CLUSTER, LOAD, TRACE_LOAD, PROBE, SEARCH, ATTAINMENT, OBJECTIVE,
OUTPUTS) and the lists that shape the rest (TOP_KEYS, SEARCH_TARGETS, SLO_KEYS, SWEEPABLE). `SECTIONS` says in
a line what each top-level key is for: a key the schema adds without a line here fails the page's build.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping

from kvplan.engine.core.settings import Field
from kvplan.experiments import schema
from kvplan.reference.cells import allowed, code, table, value
from kvplan.traces.synth import TOP_KEYS as SYNTH_KEYS
from kvplan.traces.transforms import TRANSFORM_ORDER

# What each top-level key holds, in a line (the sections below list the keys inside it).
SECTIONS = {
    "name": "required: names the result set (`results/NAME` unless `--out` says otherwise)",
    "description": "a paragraph shown in summary.md and the report",
    "model": "a built-in model ([Models](models.md)) or a path to an HF `config.json`",
    "hardware": "a built-in GPU ([Hardware](hardware.md)), `cpu-local`, or a calibrated profile "
                "(`.yaml` from `kvplan calibrate`)",
    "engine": "serving settings by their names ([Settings](settings.md)): the base every point starts from",
    "cluster": "replicas and the router in front of them",
    "disaggregation": "prefill/decode pools instead of co-located replicas (the `kvplan simulate` P/D options by "
                      "their field names; experiments.pd_block): a P:D grid sweeps its options or whole blocks",
    "workload": "required: the requests (a trace file or a synthetic spec) and how load is offered",
    "probe": "how long a steady-state probe runs and what it trims (modes sustained and concurrency)",
    "sweep": "the points: a grid's cross product times zipped rows of values",
    "search": "per point and seed, the highest load (or fewest replicas) that is stable and meets the SLOs",
    "slo": "the latency bounds a run must meet",
    "objective": "which metric ranks the points that meet the SLOs",
    "seeds": "the seeds every point runs (every random draw of the workload)",
    "repeats": "N: seeds 0 .. N-1 (instead of seeds)",
    "outputs": "which files a run writes besides the tables",
    "prices": "$/GPU-hour over the built-in dated table: `kind` (on_demand or reserved), `file` (a YAML or JSON "
              "table), and `GPU: dollars` or `GPU: {on_demand, reserved, source, date}` (docs/cost.md)",
}


def field_rows(fields: Mapping[str, Field], prefix: str, link: bool = False,
               modes: Mapping[str, str] | None = None) -> list[list[str]]:
    rows = []
    for key, f in fields.items():
        name = f"[{code(prefix + key)}](settings.md#{key})" if link else code(prefix + key)
        default = "derived" if f.derived else code(value(f.default)) if f.default is not None or f.nullable \
            else "required"
        row = [name, default, allowed(f)]  # what is allowed says the kind: an integer, true or false, ...
        if modes is not None:
            row.append(modes.get(key, "any"))
        rows.append([*row, f.help])
    return rows


def field_table(fields: Mapping[str, Field], prefix: str, **kw: object) -> list[str]:
    headers = ["key", "default", "allowed", *(["mode"] if kw.get("modes") is not None else []), "help"]
    return [*table(headers, field_rows(fields, prefix, **kw)), ""]  # type: ignore[arg-type]


def example() -> list[str]:
    """The annotated example of the schema module's docstring (its second paragraph), as written there."""
    paragraphs = (inspect.getdoc(schema) or "").split("\n\n")
    return ["```yaml", inspect.cleandoc(paragraphs[1]), "```", ""]


def schema_page() -> str:
    missing = [key for key in schema.TOP_KEYS if key not in SECTIONS]
    if missing:
        raise KeyError(f"reference/schema.md: no line for the top-level keys {missing} in SECTIONS")
    sweepable_other = [key for key in schema.SWEEPABLE if not key.startswith("engine.")]
    assert all(f"engine.{k}" in schema.SWEEPABLE for k in schema.ENGINE), "every engine setting is sweepable"
    targets = [[code(t), code(key), schema.TARGET_MODES.get(t, "any"),
                *(code(value(v)) for v in schema.SEARCH_DEFAULTS[t]),
                "whole steps" if t in schema.INTEGER_TARGETS else "relative (`tolerance`)"]
               for t, key in schema.SEARCH_TARGETS.items()]
    lines = ["# Experiment file", "",
             "An experiment is one YAML file that `kvplan run` reads: what to simulate, what to vary and what "
             "\"good\" means. This page is generated from the schema (`kvplan/experiments/schema.py`) when the "
             "docs are built; every key below is checked when the file is loaded, before any run, and a bad "
             "value is refused with its key path, the value and what is allowed. Annotated:", "",
             *example(),
             "## Top-level keys", "",
             *table(["key", "what it holds"], [[code(k), SECTIONS[k]] for k in schema.TOP_KEYS]), "",
             "## model and hardware", "",
             *field_table(schema.TOP, ""),
             "## engine", "",
             "Every setting the simulator reads, by its name; the [Settings](settings.md) page says what each "
             "does. Earlier names of a setting are still read.", "",
             *field_table(schema.ENGINE, "engine.", link=True),
             "## cluster", "", *field_table(schema.CLUSTER, "cluster."),
             "## workload", "",
             f"Exactly one of {code('workload.trace')} (a file, relative to the experiment file, or "
             f"{code('sample:NAME')}: `kvplan trace samples` lists them) and {code('workload.synthetic')} (a "
             f"`kvplan trace synth` spec inline, with the keys {', '.join(code(k) for k in SYNTH_KEYS)}). "
             f"{code('workload.format')} names the trace's format (default: detected from the content); "
             f"{code('workload.transforms')} applies {', '.join(code(k) for k in TRANSFORM_ORDER if k != 'rate_scale')}"
             " in this order (each as `kvplan trace convert` takes it: "
             "[kvplan trace convert](cli.md#kvplan-trace-convert)). These apply to a trace file only:", "",
             *field_table(schema.TRACE_LOAD, "workload."),
             "How load is offered: the `mode` a key applies to is the only one it may be written with "
             f"(modes: {', '.join(code(m) for m in schema.MODES)}).", "",
             *field_table(schema.LOAD, "workload.", modes=schema.LOAD_MODES),
             "## probe", "",
             "A steady-state probe (modes sustained and concurrency) runs at least `duration_s` and "
             "`min_requests` measured requests; a probe must be stable before its SLOs count.", "",
             *field_table(schema.PROBE, "probe."),
             "## sweep", "",
             f"{code('sweep.grid')} maps keys to lists of values and runs their cross product; {code('sweep.zip')} "
             f"maps keys to lists of one length and pairs them row by row; the points are the grid times the "
             f"rows (at most {schema.MAX_POINTS:,}). A sweep may vary every {code('engine.')} setting and "
             f"{', '.join(code(k) for k in sweepable_other)}.", "",
             "## search", "",
             *field_table(schema.SEARCH, "search."),
             "What each target varies, the load mode it implies and its default range:", "",
             *table(["target", "varies", "mode", "default low", "default high", "steps"], targets), "",
             "## slo", "",
             "Upper bounds on the summary's latency percentiles ([Metrics](metrics.md#summary-metrics)); a run "
             "meets its SLO when every bound holds. `slo.attainment` instead bounds each request and asks that "
             "a share of them meet every bound (DistServe's goodput).", "",
             *table(["key", "bounds the metric"], [[code(f"slo.{k}"), code(m)] for k, m in schema.SLO_KEYS.items()]),
             "", *field_table(schema.ATTAINMENT, "slo.attainment."),
             "## objective", "",
             *field_table({k: f for k, f in schema.OBJECTIVE.items() if k != "metric"}, "objective."),
             f"{code('objective.metric')} (default {code(schema.OBJECTIVE['metric'].default)}) is any summary "
             "metric ([Metrics](metrics.md#summary-metrics)).", "",
             "## seeds and repeats", "",
             f"{code('seeds')}: a list of distinct integers >= 0 and <= {schema.MAX_SEED} (at most "
             f"{schema.MAX_SEEDS}); default {code(schema.SEARCH_SEEDS)} for a search that draws, else "
             f"{code([0])}. {code('repeats')}: N, for seeds 0 .. N-1 (one of the two).", "",
             "## outputs", "", *field_table(schema.OUTPUTS, "outputs.")]
    return "\n".join(lines).rstrip("\n") + "\n"
