"""A/B of the pure-Python core against compiled builds of it (scripts/build_compiled_core.sh) on `kvplan bench sim`
regimes; writes the figures into docs/compiled-core.md.

Each run is one regime in a fresh process whose PYTHONPATH puts a build first (the checkout for `pure`); the
variants run interleaved (their order rotates every repeat), because this shared machine's speed drifts ~1.8x
between 10 s windows: a ratio of medians over interleaved runs is the figure, never one run against another taken
minutes apart. Every run also hashes its whole result (summary, per-request table, time series): a compiled build
must reproduce the pure core's result bit for bit.

    PYTHONPATH=. python scripts/compiled_core_bench.py core=/tmp/core core+sim=/tmp/core_sim \
        --regimes azure_conv_on burst --repeats 3 [--write]

    PYTHONPATH=. python scripts/compiled_core_bench.py --profile --regimes azure_conv_on burst [--write]

`--write` replaces the block between `<!-- compiled-core-bench -->` and `<!-- /compiled-core-bench -->` in
docs/compiled-core.md with the command and its table (`--profile`: the `compiled-core-profile` block). `--profile`
runs each regime once on the pure core under cProfile and splits its own time (tottime) by where the code lives:
the shared core is all a core-only build can speed up.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "compiled-core.md"
DATA_DIR = ROOT.parent / "shared" / "data"  # the public traces, beside the checkout (a build's copy has none)
DEFAULT_REGIMES = ("azure_conv_on", "azure_conv_x4", "mooncake_conv", "burst")


def worker(regime: str) -> None:
    """Run one regime here and print its wall time, speed and the hash of its whole result as one JSON line."""
    import pandas as pd

    import kvplan.engine.core.scheduler as scheduler
    import kvplan.sim.run as run
    from kvplan.bench.sim import _regime

    results = []
    cpu = []
    simulate = run.simulate

    def keep(*args, **kwargs):  # `bench.sim.timed` imports simulate at call time: this wrapper is what it gets
        start = time.process_time()
        results.append(simulate(*args, **kwargs))
        cpu.append(time.process_time() - start)
        return results[-1]

    run.simulate = keep
    row = _regime(regime, str(DATA_DIR), 1_000_000, 16, 6.0, 0)
    if row.get("skipped"):
        raise SystemExit(row["reason"])
    digest = hashlib.sha256()
    for result in results:
        digest.update(json.dumps(result.summary, sort_keys=True, default=repr).encode())
        for frame in (result.requests, result.series):
            digest.update(pd.util.hash_pandas_object(frame, index=True).to_numpy().tobytes())
            digest.update(",".join(map(str, frame.columns)).encode())
    print(json.dumps({"regime": regime, "core": scheduler.__file__, "wall_s": row["wall_s"], "cpu_s": sum(cpu),
                      "simulated_s": row["simulated_s"], "steps": row["steps"], "hash": digest.hexdigest()[:16]}))


def run_once(regime: str, root: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", regime], env=env,
                          capture_output=True, text=True, check=False, timeout=1800)
    if proc.returncode:
        raise SystemExit(f"{regime} under {root} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(variants: dict[str, Path], regimes: list[str], repeats: int) -> list[str]:
    """Markdown rows: per regime and variant, the median CPU and wall time of the simulation, the speed-ups over
    pure (CPU time is the steadier figure on a shared machine: other sessions' load stretches wall time), and the
    result hash."""
    runs: dict[tuple[str, str], list[dict]] = {}
    simulated: dict[str, float] = {}
    names = list(variants)
    for repeat in range(repeats):
        for regime in regimes:
            for name in names[repeat % len(names):] + names[:repeat % len(names)]:
                row = run_once(regime, variants[name])
                if name != "pure" and ".so" not in row["core"]:
                    raise SystemExit(f"{name}: the scheduler came from {row['core']}, not a compiled build")
                runs.setdefault((regime, name), []).append(row)
                simulated[regime] = row["simulated_s"]
                print(f"repeat {repeat + 1} {regime:14s} {name:10s} cpu {row['cpu_s']:7.2f} s wall "
                      f"{row['wall_s']:7.2f} s  {row['hash']}", file=sys.stderr, flush=True)

    def median(regime: str, name: str, key: str) -> float:
        return statistics.median(row[key] for row in runs[(regime, name)])

    lines = ["| regime | build | CPU s | wall s | x real time (CPU) | speed-up (CPU) | speed-up (wall) | result hash "
             "| same as pure |", "|---|---|---:|---:|---:|---:|---:|---|---|"]
    for regime in regimes:
        pure_hashes = {row["hash"] for row in runs[(regime, "pure")]}
        for name in names:
            cpu, wall = median(regime, name, "cpu_s"), median(regime, name, "wall_s")
            hashes = {row["hash"] for row in runs[(regime, name)]}
            same = "yes" if hashes == pure_hashes and len(hashes) == 1 else "NO"
            pure_cpu, pure_wall = median(regime, "pure", "cpu_s"), median(regime, "pure", "wall_s")
            lines.append(f"| {regime} | {name} | {cpu:.2f} | {wall:.2f} | {simulated[regime] / cpu:.0f} "
                         f"| {pure_cpu / cpu:.2f}x | {pure_wall / wall:.2f}x "
                         f"| {' '.join(sorted(hashes))} | {same} |")
    return lines


AREAS = (("kvplan/engine/core/", "shared core (kvplan/engine/core)"), ("kvplan/sim/", "simulator (kvplan/sim)"),
         ("kvplan/", "rest of kvplan"), ("", "builtins, numpy, simpy, pandas"))


def profile(regimes: list[str]) -> list[str]:
    """Markdown rows: per regime, the share of the pure core's profiled own time in each area of `AREAS`."""
    import cProfile
    import pstats

    from kvplan.bench.sim import _regime

    lines = ["| regime | " + " | ".join(label for _, label in AREAS) + " |", "|---|" + "---:|" * len(AREAS)]
    for regime in regimes:
        profiler = cProfile.Profile()
        profiler.runcall(_regime, regime, str(DATA_DIR), 1_000_000, 16, 6.0, 0)
        shares = dict.fromkeys((label for _, label in AREAS), 0.0)
        for (file, _, _), (_, _, own, _, _) in pstats.Stats(profiler).stats.items():  # type: ignore[attr-defined]
            shares[next(label for prefix, label in AREAS if prefix in file.replace("\\", "/"))] += own
        total = sum(shares.values())
        lines.append(f"| {regime} | " + " | ".join(f"{100 * v / total:.0f}%" for v in shares.values()) + " |")
    return lines


def write_block(name: str, block: list[str]) -> None:
    """Replace the page's `<!-- name -->` ... `<!-- /name -->` block (markers kept) with `block`."""
    start, end = f"<!-- {name} -->", f"<!-- /{name} -->"
    head, found, rest = PAGE.read_text().partition(start)
    if not found or end not in rest:
        raise SystemExit(f"{PAGE}: no {start} ... {end} block to write")
    PAGE.write_text(head + "\n".join([start, *block, end]) + rest.partition(end)[2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("builds", nargs="*", help="LABEL=DIR: a build of scripts/build_compiled_core.sh")
    parser.add_argument("--regimes", nargs="+", default=list(DEFAULT_REGIMES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--write", action="store_true", help=f"write the table into {PAGE.relative_to(ROOT)}")
    parser.add_argument("--profile", action="store_true", help="profile the pure core instead (see the module)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker)
        return
    if args.profile:
        command = f"PYTHONPATH=. python scripts/compiled_core_bench.py --profile --regimes {' '.join(args.regimes)}"
        block = ["```text", f"$ {command}", "```", "", *profile(args.regimes)]
        print("\n".join(block))
        if args.write:
            write_block("compiled-core-profile", block)
        return
    variants = {"pure": ROOT}
    for build in args.builds:
        label, sep, path = build.partition("=")
        if not sep or not Path(path, "kvplan").is_dir():
            raise SystemExit(f"{build}: expected LABEL=DIR with DIR a build of scripts/build_compiled_core.sh")
        variants[label] = Path(path).resolve()
    command = "PYTHONPATH=. python scripts/compiled_core_bench.py " + " ".join(
        f"{label}=DIR" for label in variants if label != "pure") + \
        f" --regimes {' '.join(args.regimes)} --repeats {args.repeats}"
    block = ["```text", f"$ {command}", "```", "", *measure(variants, args.regimes, args.repeats)]
    print("\n".join(block))
    if args.write:
        write_block("compiled-core-bench", block)


if __name__ == "__main__":
    main()
