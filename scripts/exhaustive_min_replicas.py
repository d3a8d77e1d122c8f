"""Check a `min_replicas` search against an exhaustive run of the same grid. It runs the experiment as written
(`kvplan run`: the analytic bound, the climb, the guided seeds), then the same grid with every replica count from
the search's `low` to its `high`, every seed, and no search - one plain steady-state probe per (point, seed,
replicas) - and times both. Per point and seed the exhaustive answer is the fewest replicas whose probe is stable
and meets every SLO; any count above it that fails is listed too (the search's monotonicity assumption,
`experiments.search`). Each seed's answer and each point's median are compared with the search's.

    PYTHONPATH=. .venv/bin/python scripts/exhaustive_min_replicas.py experiments/gpus_needed_70b.yaml \
        --out results/gpus_needed_70b-exhaustive --workers 2

Exit status 0 when every answer matches, 1 when one differs.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import yaml

from kvplan.errors import UserError
from kvplan.experiments.schema import Experiment, load_experiment


def exhaustive_doc(doc: dict, exp: Experiment) -> dict:
    """The experiment without its search: its grid gains `cluster.replicas` over the search's [low, high], and it
    runs the seeds the search ran (`exp`: the experiment as the schema read it, defaults resolved)."""
    out = {k: v for k, v in doc.items() if k not in ("search", "objective", "repeats")}
    out["name"] = f"{exp.name}-exhaustive"
    sweep = dict(out.get("sweep") or {})
    sweep["grid"] = {**(sweep.get("grid") or {}),
                     "cluster.replicas": list(range(int(exp.search["low"]), int(exp.search["high"]) + 1))}
    out["sweep"] = sweep
    out["seeds"] = list(exp.seeds)
    workload = dict(out.get("workload") or {})
    trace = workload.get("trace")
    if isinstance(trace, str) and ":" not in trace and not Path(trace).is_absolute():
        workload["trace"] = str((exp.source.parent / trace).resolve())  # relative to the experiment's file
    out["workload"] = workload
    return out


def label(frame: pd.DataFrame, keys: list[str]) -> pd.Series:
    """A point's grid values in words (`tensor_parallel_size=4 hardware=h200`), the same in both result sets."""
    if not keys:
        return pd.Series("all", index=frame.index)
    return frame[keys].astype(str).apply(lambda row: " ".join(f"{k.split('.')[-1]}={v}" for k, v in row.items()),
                                         axis=1)


def exhaustive_answers(runs: pd.DataFrame) -> pd.DataFrame:
    """Per point and seed: the fewest replicas that meet, and the counts above it that fail."""
    rows = []
    for (label, seed), group in runs.groupby(["label_point", "seed"]):
        group = group.sort_values("cluster.replicas")
        met = group.loc[group["slo_met"].astype(bool), "cluster.replicas"].tolist()
        fewest = min(met) if met else None
        failing_above = [int(r) for r, ok in zip(group["cluster.replicas"], group["slo_met"], strict=True)
                         if fewest is not None and r > fewest and not ok]
        rows.append({"point": label, "seed": int(seed), "exhaustive": fewest, "failing_above": failing_above,
                     "probes": len(group)})
    return pd.DataFrame(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("experiment", type=Path)
    parser.add_argument("--out", type=Path, required=True, help="the two result sets go to OUT/search, OUT/run")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--resume", action="store_true", help="reuse the finished runs under OUT (walls then count "
                                                               "only what was left to run)")
    args = parser.parse_args()
    try:
        exp = load_experiment(args.experiment)
    except UserError as exc:  # one line naming the file and key, as `kvplan run` prints it
        print(f"exhaustive_min_replicas: error: {exc}", file=sys.stderr)
        return 2
    if not exp.search or exp.search["target"] != "min_replicas":
        print(f"exhaustive_min_replicas: error: {args.experiment}: search.target: "
              f"{(exp.search or {}).get('target')!r}; allowed: min_replicas", file=sys.stderr)
        return 2
    doc = yaml.safe_load(args.experiment.read_text())
    args.out.mkdir(parents=True, exist_ok=True)
    derived = args.out / "exhaustive.yaml"
    derived.write_text(yaml.safe_dump(exhaustive_doc(doc, exp), sort_keys=False))
    walls = []
    for experiment, out in ((args.experiment, args.out / "search"), (derived, args.out / "run")):
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "kvplan", "run", str(experiment), "--out", str(out), "--workers",
                               str(args.workers), "--quiet", *(["--resume"] if args.resume else [])],
                              capture_output=True, text=True, check=False)
        if done.returncode:
            raise SystemExit(f"kvplan run {experiment} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
        walls.append(time.perf_counter() - start)
    keys = list(exp.sweep_grid)
    runs = pd.read_parquet(args.out / "run" / "runs.parquet")
    runs["label_point"] = label(runs, keys)
    found = exhaustive_answers(runs)
    points = pd.read_parquet(args.out / "search" / "points.parquet")
    search_probes = len(pd.read_parquet(args.out / "search" / "runs.parquet"))
    points["label_point"] = label(points, keys)
    print(f"search:     {search_probes} probes in {walls[0]:.0f} s ({args.workers} workers; model range included)")
    print(f"exhaustive: {len(runs)} probes in {walls[1]:.0f} s (replicas {exp.search['low']} to "
          f"{exp.search['high']}, every seed)")
    print(f"{'point':<42} {'seed':>4} {'exhaustive':>10} {'search':>6}  counts above failing")
    same = True
    for _, point in points.iterrows():
        answers = [int(a) for a in str(point["answers"]).split(",")]
        mine = found[found["point"] == point["label_point"]].sort_values("seed")
        for (_, row), searched in zip(mine.iterrows(), answers, strict=True):
            ok = row["exhaustive"] == searched
            same &= ok
            print(f"{point['label_point']:<42} {row['seed']:>4} {row['exhaustive']!s:>10} {searched:>6}  "
                  f"{row['failing_above'] or '-'}{'' if ok else '  DIFFERENT'}")
        median = mine["exhaustive"].median()
        ok = median == point["answer"]
        same &= ok
        print(f"{point['label_point']:<42}  med {median!s:>10} {point['answer']:>6g}{'' if ok else '  DIFFERENT'}")
    print("every answer matches" if same else "answers differ")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
