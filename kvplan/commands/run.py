"""`kvplan run EXPERIMENT.yaml`: every point of a capacity-planning experiment on the simulator, in parallel,
resumable; writes runs.parquet, points.parquet, summary.md, plots and report.html, and prints the
recommendation with its model range (the answer re-searched at the edges of the step-time error band of the
source that priced the GPU: `experiments.model_range`). `--explain` prints the resolved points and the plan's
estimated wall time (`experiments.estimate`: micro-runs in memory, about a second) and writes nothing."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvplan.arg_types import integer, out_path
from kvplan.errors import UserError
from kvplan.output import check_out_dir, check_paths, format_table, print_json, safe_name


def register(verbs: argparse._SubParsersAction) -> None:
    p = verbs.add_parser("run", help="run a YAML capacity-planning experiment", description=__doc__)
    p.add_argument("experiment", help="experiment YAML, or example:NAME for a bundled example (experiments/)")
    p.add_argument("--out", type=out_path, default=None, help="result directory (default: results/NAME)")
    p.add_argument("--workers", type=integer(1, 256), default=1, help="parallel worker processes (or Ray CPUs)")
    p.add_argument("--backend", choices=("local", "ray"), default="local")
    p.add_argument("--ray-address", default=None, help="an existing Ray cluster (default: a local instance)")
    p.add_argument("--resume", action="store_true", help="reuse finished runs of an interrupted or earlier run")
    p.add_argument("--explain", action="store_true",
                   help="print the resolved points and the plan's estimated wall time (on --workers), and exit")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--wide", action="store_true", help="print all of summary.md (every column of every point) "
                   "instead of the answer, which fits 100 columns")
    from kvplan.commands.simulate import add_price_options

    add_price_options(p)  # over the experiment's prices: block
    p.set_defaults(handler=run)


def load(path: Path):  # -> (Experiment, list[Point])
    from kvplan.errors import ConfigError
    from kvplan.experiments.check import check_point, resolve
    from kvplan.experiments.fields import SchemaError
    from kvplan.experiments.min_cost import is_cost_search, screen
    from kvplan.experiments.points import expand
    from kvplan.experiments.schema import load_experiment
    from kvplan.experiments.trace_needs import prefix_warning

    exp = load_experiment(path)
    try:
        resolve(exp)
        points = expand(exp)
        # a min_cost search rejects the shapes a gate or the memory refuses (min_cost.screen) instead of stopping
        shapes = screen(exp, points) if is_cost_search(exp) else {}
        rejected = {i for i, s in shapes.items() if s.status}
        if shapes and len(rejected) == len(points):  # nothing left to search
            first = shapes[points[0].index]
            raise SchemaError(f"sweep.grid: every shape is refused before a run, e.g. point 0 ({first.label}): "
                              f"{first.status}: {first.reason}")
        traces = [check_point(exp, point) for point in points if point.index not in rejected]
    except ConfigError as exc:  # a field's or the schema's: the key path, now after the file
        raise SchemaError(f"{path}: {exc}") from None
    # once, after every point passed (a refused file says its one line only); workload.trace is not swept, so
    # every point's workload carries the same fields
    warning = prefix_warning(exp, points, traces[-1])
    if warning is not None:
        print(f"warning: {warning}", file=sys.stderr)
    return exp, points


def explain(exp, points, workers: int = 1) -> dict:
    """The resolved plan, and its estimated wall time on `workers` (`experiments.estimate`: a micro-run now)."""
    from kvplan.experiments.estimate import edge_searches, estimate_plan
    from kvplan.experiments.min_cost import is_cost_search, screen
    from kvplan.experiments.model_range import edge_scales, point_errors
    from kvplan.experiments.results import slo_lines

    searched = f"{exp.search['target']} over [{exp.search['low']:g}, {exp.search['high']:g}]" if exp.search else None
    # a min_cost search runs only the shapes neither a gate nor the memory refuses (an upper estimate: no pruning)
    shapes = screen(exp, points) if is_cost_search(exp) else {}
    runs = [p for p in points if not (p.index in shapes and shapes[p.index].status)]
    estimate = estimate_plan(exp, runs, edge_searches(exp, runs, edge_scales(point_errors(exp))), workers)
    return {"name": exp.name, "base": exp.base, "seeds": exp.seeds, "search": searched, "slo": slo_lines(exp),
            "objective": exp.objective, "points": [{"point": p.index, "label": p.label, "values": p.values}
                                                   for p in points], "derived": derived_lines(points),
            "estimate": estimate.as_dict(), "estimate_lines": estimate.lines()}


def derived_lines(points) -> list[str]:
    """What the simulator fills in that the experiment left unset (vLLM's per-GPU batch defaults) and what its
    latencies include (the API server or not), once per distinct line, naming the points each applies to when
    they are not all of them."""
    from kvplan.experiments.execute import build_spec
    from kvplan.sim.frontend import explain as explain_frontend
    from kvplan.sim.vllm_defaults import explain as explain_defaults

    lines: dict[str, list[int]] = {}
    for p in points:
        spec = build_spec(p.config)
        for line in (*explain_defaults(spec), explain_frontend(spec.entry_point, spec.api_server_latency_ms)):
            if line is not None:
                lines.setdefault(line, []).append(p.index)
    every = [p.index for p in points]
    return [line if where == every else f"points {', '.join(map(str, where))}: {line}"
            for line, where in lines.items()]


def run(args: argparse.Namespace) -> int:
    if args.workers < 1:
        raise UserError(f"--workers: must be >= 1, got {args.workers}")
    from kvplan.experiments.examples import experiment_path

    exp, points = load(experiment_path(args.experiment))
    from kvplan.commands.simulate import prices_from_args

    exp.prices = prices_from_args(args, exp.prices)
    # The default --out is results/NAME: checked for --explain too, so a dry run does not pass what the run refuses
    out = args.out or Path("results") / safe_name(exp.name, f"{exp.source}: name")
    if args.explain:
        doc = explain(exp, points, args.workers)
        if args.json:
            print_json(doc)
        else:
            print_explain(doc)
        return 0
    from kvplan.experiments.report import write_results
    from kvplan.experiments.runner import run_experiment

    check_out_dir(out)
    check_paths(experiment_inputs(exp, points),
                {"--out": out, "--out (its staging)": out.with_name(out.name + ".partial")})
    if args.resume:
        check_resumes_its_own(out, exp.name)
    outcome = run_experiment(exp, out, workers=args.workers, backend=args.backend, ray_address=args.ray_address,
                             resume=args.resume, progress=not args.quiet and not args.json, write=write_results)
    doc = (out / "result.json").read_text()
    from kvplan.commands.simulate import print_notes

    # once per distinct line over all runs (every run of one trace file loads it alike); stderr keeps --json strict
    notes = (note for run in outcome.runs.values() for note in run["doc"].get("trace_notes", []))
    print_notes(list(dict.fromkeys(notes)))
    if args.json:
        print(doc)
        return 0
    if args.wide:  # everything: the answer, the full points table, each capacity, the model error
        print((out / "summary.md").read_text())
    else:
        from kvplan.experiments.answer import print_result_set

        print_result_set(exp, out)
    print(f"wrote {out}/: report.html, summary.md, runs.parquet ({len(outcome.runs)} runs), points.parquet, plots/",
          file=sys.stderr)
    return 0


def experiment_inputs(exp, points) -> dict[str, str]:
    """What the experiment reads (its file, every point's trace and profile), each labelled once by its key."""
    found = {str(exp.source): "the experiment"}
    for p in points:
        hardware = p.config["hardware"]
        for key, value in (("workload.trace", p.config["workload"].get("trace")),
                           ("hardware", hardware if hardware.endswith((".yaml", ".yml")) else None)):
            if value is not None:
                found.setdefault(str(value), f"{key} (point {p.index})")
    return {label: path for path, label in found.items()}


def check_resumes_its_own(out: Path, name: str) -> None:
    """--resume continues an experiment: a DIR holding another experiment's set is refused (none of its runs
    apply, and resuming would replace it, which a mistyped --out should not do quietly)."""
    from kvplan.strict_json import loads

    try:
        doc = loads((out / "result.json").read_bytes())
    except (OSError, ValueError):
        return  # no finished set there, or a damaged one: the swap refuses a changed file, naming it
    held = doc.get("name") if isinstance(doc, dict) else None
    if isinstance(held, str) and held != name:
        raise UserError(f"--resume: {out} holds the result set of experiment {held!r}, not {name!r}; allowed: the "
                         f"--out of experiment {name!r}, or no --resume to replace it")


def print_explain(doc: dict) -> None:
    print(f"experiment {doc['name']}: {len(doc['points'])} point(s) x seeds {doc['seeds']}"
          + (f", search {doc['search']}" if doc["search"] else ""))
    base = doc["base"]
    print(f"base: model {base['model']}, hardware {base['hardware']}, cluster {base['cluster']}")
    print("engine: " + ", ".join(f"{k}={v}" for k, v in base["engine"].items()))
    print("workload: " + ", ".join(f"{k}={v}" for k, v in base["workload"].items()))
    if doc["slo"]:
        print("slo: " + "; ".join(doc["slo"]))
    for line in doc["derived"]:
        print(f"default: {line}")
    print(f"objective: {doc['objective']['goal']} {doc['objective']['metric']}")
    rows = [[p["point"], p["label"]] for p in doc["points"]]
    print(format_table(("point", "values"), rows))
    print("\n".join(doc["estimate_lines"]))
