"""Running an experiment: every point's runs on a pool of worker processes (or Ray tasks), finished runs
reused, progress on stderr, and the result set swapped in whole at the end.

    OUT.partial/runs/<key>/   each run, written whole as it finishes (content-addressed: see points.run_key)
    OUT.partial/...           the aggregate tables, plots and report, written last
    OUT                       <- OUT.partial renamed over it once everything is written

A crash (or Ctrl-C) leaves OUT as it was and OUT.partial with every finished run; `--resume` continues from
OUT.partial (or from OUT's runs when there is no partial set), so an interrupted sweep loses nothing and a
re-run computes only what is missing. OUT.partial carries kvplan's staging marker (`kvplan.ownership`): a folder
of that name without one, or holding anything kvplan did not write, is refused untouched; a run whose files do
not match its manifest is never resumed (one line naming it).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kvplan.errors import UserError
from kvplan.experiments.estimate import edge_searches, search_probes
from kvplan.experiments.execute import execute_run, read_run
from kvplan.experiments.min_cost import CostPlan, is_cost_search, screen
from kvplan.experiments.model_range import edge_scales, point_errors
from kvplan.experiments.points import expand, run_key
from kvplan.experiments.progress import Progress
from kvplan.experiments.schema import Experiment
from kvplan.experiments.search import PointTask, edge_tasks, make_tasks, slo_verdict
from kvplan.output import is_result_set, publish, write_manifest
from kvplan.ownership import (
    MANIFEST,
    MARKER,
    alive,
    discard,
    owned_files,
    read_manifest,
    read_marker,
    remove_listed,
    resolve_out,
    write_marker,
)
from kvplan.sim.gpu.model_error import ModelError


class Finished:
    """A run made in this process (one worker): a handle that is already done."""

    __slots__ = ("doc",)

    def __init__(self, doc: dict) -> None:
        self.doc = doc


class LocalBackend:
    """Worker processes (`workers` > 1) or this process (1): the same calls either way."""

    def __init__(self, workers: int) -> None:
        self.pool = None
        if workers > 1:
            from concurrent.futures import ProcessPoolExecutor

            self.pool = ProcessPoolExecutor(max_workers=workers)

    def submit(self, config: dict, run_dir: str, tables: bool):
        if self.pool is None:
            return Finished(execute_run(config, run_dir, tables))
        return self.pool.submit(execute_run, config, run_dir, tables)

    def wait(self, handles: list) -> list:
        ready = [h for h in handles if isinstance(h, Finished)]
        if ready or not handles:
            return ready
        from concurrent.futures import FIRST_COMPLETED, wait

        return list(wait(handles, return_when=FIRST_COMPLETED).done)

    @staticmethod
    def result(handle) -> dict:
        return handle.doc if isinstance(handle, Finished) else handle.result()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)


class RayBackend:
    """The same runs as Ray tasks: a local Ray instance by default, or the cluster at `address`."""

    def __init__(self, address: str | None, workers: int) -> None:
        try:
            import ray
        except ModuleNotFoundError:
            raise UserError("--backend ray: Ray is not installed; install it with: "
                             "pip install 'kvplan[ray]'") from None
        self.ray = ray
        if not ray.is_initialized():
            kwargs = {"address": address} if address else {"num_cpus": workers, "include_dashboard": False}
            ray.init(ignore_reinit_error=True, log_to_driver=False, **kwargs)
        self.task = ray.remote(execute_run)

    def submit(self, config: dict, run_dir: str, tables: bool):
        return self.task.remote(config, run_dir, tables)

    def wait(self, handles: list) -> list:
        return self.ray.wait(handles, num_returns=1)[0] if handles else []

    def result(self, handle) -> dict:
        return self.ray.get(handle)

    def close(self) -> None:
        self.ray.shutdown()


@dataclass(slots=True)
class Outcome:
    tasks: list[PointTask]
    runs: dict[str, dict]  # run key -> {config, doc (summary.json), met, broken (SLO lines), points (task indices)}
    made: int = 0  # runs simulated now
    reused: int = 0  # finished runs found in the staging directory (--resume)
    model_errors: dict[int, ModelError] = field(default_factory=dict)  # point index -> its cost model's error
    plan: CostPlan | None = None  # a min_cost search's shapes, their screening and what the cost bound skipped


# What `report.write_results` writes beside runs/ (a test holds the two together): with runs/, the marker and a
# manifest, all a kvplan-made OUT.partial may hold.
AGGREGATES = ("runs.parquet", "points.parquet", "experiment.yaml", "summary.md", "result.json", "report.html", "plots")


def prepare_staging(out: Path, resume: bool) -> Path:
    """OUT.partial with kvplan's staging marker: reused by --resume, else emptied of what kvplan wrote there. A
    folder of that name without the marker, or holding anything kvplan did not write, is refused untouched."""
    staging = out.with_name(out.name + ".partial")
    if staging.is_symlink():
        raise UserError(f"--out: {staging} is a symbolic link; {_PARTIAL_ALLOWED}")
    if staging.exists():
        runs = _partial_runs(staging)
        if not resume:
            _clear_partial(staging, runs)
    elif resume and (out / "runs").is_dir():
        # Resume from a finished set: hard links of its run sets, so OUT stays untouched until the new set replaces it
        for run in (out / "runs").iterdir():
            if is_result_set(run):
                shutil.copytree(run, staging / "runs" / run.name, symlinks=True, copy_function=os.link)
    (staging / "runs").mkdir(parents=True, exist_ok=True)
    write_marker(staging, "partial", out)
    return staging


_PARTIAL_ALLOWED = ("nothing was removed; allowed: move it away (`kvplan run` keeps the runs of an interrupted "
                    "experiment there), or another --out")


def _partial_runs(staging: Path) -> dict[str, list[str] | None]:
    """The entries of an existing OUT.partial/runs: a finished run's listed files, or None for a marked temporary
    directory. Refuses a partial kvplan did not make (no marker, not empty) and one holding anything else."""
    entries = sorted(p.name for p in staging.iterdir()) if staging.is_dir() else [staging.name]
    marker = read_marker(staging)
    if marker is None or marker["purpose"] != "partial":
        if entries:
            raise UserError(f"--out: {staging} is a directory kvplan did not write (it holds {entries[0]!r} and no "
                             f"kvplan staging marker); {_PARTIAL_ALLOWED}")
        return {}
    plots = staging / "plots"
    foreign = [name for name in entries if name not in (*AGGREGATES, "runs", MANIFEST, MARKER)]
    foreign += [f"plots/{p.name}" for p in (plots.iterdir() if plots.is_dir() and not plots.is_symlink() else ())
                if p.suffix != ".png" or p.is_symlink() or not p.is_file()]
    foreign += [name for name in ("runs", *AGGREGATES) if (staging / name).is_symlink()]
    if foreign:
        raise UserError(f"--out: {staging} holds {foreign[0]!r}, which kvplan did not write; {_PARTIAL_ALLOWED}")
    runs: dict[str, list[str] | None] = {}
    for run in sorted((staging / "runs").iterdir()) if (staging / "runs").is_dir() else ():
        if run.is_symlink() or not run.is_dir():
            raise UserError(f"--out: {staging} holds 'runs/{run.name}', which kvplan did not write; "
                             f"{_PARTIAL_ALLOWED}")
        marker = read_marker(run)
        if marker is not None and marker["purpose"] == "tmp":
            runs[run.name] = None
            continue
        try:
            if any(run.iterdir()):
                read_manifest(run)
        except UserError as exc:  # kvplan cannot tell its files from anyone else's there: the user decides
            raise UserError(f"--out: {exc}; nothing was removed; allowed: delete {run}, then rerun (--resume keeps "
                             "the other runs)") from None
        runs[run.name] = owned_files(run, "--out", changed_ok=True)  # a changed summary: removed, never resumed
    return runs


def _clear_partial(staging: Path, runs: dict[str, list[str] | None]) -> None:
    """Remove what kvplan wrote in OUT.partial (checked by `_partial_runs`) before a run that does not resume."""
    for name, files in runs.items():
        run = staging / "runs" / name
        marker = read_marker(run)
        if files is None:
            if marker is not None and not alive(marker["pid"]):  # a live one is another process's, still writing
                shutil.rmtree(run, ignore_errors=True)
        else:
            remove_listed(run, files)
    for name in AGGREGATES:
        path = staging / name
        if name == "plots" and path.is_dir():
            for png in path.glob("*.png"):
                png.unlink()
            path.rmdir()
        elif path.is_file():
            path.unlink()
    (staging / MANIFEST).unlink(missing_ok=True)


def run_points(exp: Experiment, staging: Path, backend, progress: Progress, tasks: list[PointTask],
               runs: dict[str, dict] | None = None) -> Outcome:
    """Drive every task not yet done to its end: submit a round, feed back verdicts, reuse finished runs. `runs`:
    those of tasks already driven (a second phase adds tasks led by finished ones)."""
    runs = {} if runs is None else runs  # run key -> ..., "points": the tasks waiting for it (equal ones run once)
    waiting: dict[int, dict[str, dict | None]] = {}  # task index -> its round's run keys -> doc (None: pending)
    inflight: dict[object, str] = {}  # backend handle -> run key
    counted = {i for i, task in enumerate(tasks) if task.done}  # counted by an earlier phase
    plan = next((t.plan for t in tasks if t.plan is not None), None)

    def issue(index: int, configs: list[dict]) -> None:
        keys = [run_key(c) for c in configs]
        waiting[index] = dict.fromkeys(keys)  # the whole round first: a round completes only when all of it has
        for key, config in zip(keys, configs, strict=True):
            runs.setdefault(key, {"config": config, "points": []})["points"].append(index)
            if len(runs[key]["points"]) > 1:  # another point asked for the same run: share it
                waiting[index][key] = runs[key].get("doc")
                continue
            done = read_run(staging / "runs" / key)
            if done is not None:
                progress.update(reused=True)
                record(key, done)
                waiting[index][key] = done
            else:
                inflight[backend.submit(config, str(staging / "runs" / key), exp.outputs["tables"])] = key
        maybe_advance(index)

    def record(key: str, doc: dict) -> None:
        runs[key]["doc"] = doc
        runs[key]["met"], runs[key]["broken"] = slo_verdict(exp, doc)

    def deliver(key: str, doc: dict) -> None:
        record(key, doc)
        for index in runs[key]["points"]:
            if key in waiting.get(index, {}):
                waiting[index][key] = doc
                maybe_advance(index)

    def maybe_advance(index: int) -> None:
        round_docs = waiting[index]
        if any(doc is None for doc in round_docs.values()):
            return
        met = all(runs[key]["met"] for key in round_docs)
        del waiting[index]
        following = tasks[index].next(met)
        if following:
            issue(index, following)
            return
        if index not in counted:  # each task ends once: done never counts one twice
            counted.add(index)
            progress.ended(max(len(tasks[index].probes), 1) * len(tasks[index].seeds))
        for j, task in enumerate(tasks):  # guided searches waiting for this one
            if task.leader is tasks[index]:
                issue(j, task.first())
        release()

    def release() -> None:
        """A min_cost plan's next shapes (`min_cost.CostPlan.release`); the shapes it skips end unsearched."""
        if plan is None:
            return
        skipped, resume = plan.release(tasks)
        for j, ceiling in resume:
            if tasks[j].capped and ceiling > tasks[j].current:  # not resumed already by a nested release
                issue(j, tasks[j].resume(ceiling))
        for j, task in enumerate(tasks):
            if task.point.index in skipped and not task.done:
                task.done, task.outcome = True, "skipped by the cost bound"
                counted.add(j)
                progress.ended(0)
            elif task.ready and not task.done and task.current is None and j not in waiting:
                issue(j, task.first())

    release()

    for i, task in enumerate(tasks):
        if task.ready and not task.done and task.current is None:
            issue(i, task.first())
    while inflight:
        for handle in backend.wait(list(inflight)):
            key = inflight.pop(handle)
            progress.update(run=True)
            deliver(key, backend.result(handle))
    return Outcome(tasks, runs, progress.runs, progress.reused)


def recommended_points(exp: Experiment, outcome: Outcome) -> list[int]:
    """The point the finished searches recommend (`results.recommend`, as the result set will say), or every
    point tied for best when the seeds do not separate them: each gets its model range. A model range never
    breaks a tie (`ranking`), so searching it for the tied points cannot change which points are tied for best."""
    from kvplan.experiments.results import points_table, recommend, runs_frame

    rec = recommend(exp, points_table(exp, outcome, runs_frame(exp, outcome)))
    return list(rec.tie) if rec.tie else ([] if rec.point is None else [rec.point])


def run_experiment(exp: Experiment, out: Path, *, workers: int = 1, backend: str = "local",
                   ray_address: str | None = None, resume: bool = False, progress: bool = True,
                   write: Callable[[Experiment, Outcome, Path], None] | None = None) -> Outcome:
    """Run every point into OUT.partial, write the aggregate result there, then swap it in as OUT."""
    errors = point_errors(exp)  # read before any run: a malformed profile or data file fails fast
    scales = edge_scales(errors)
    mode = exp.search["model_range"] if exp.search else "none"
    out = resolve_out(out)
    staging = prepare_staging(out, resume)
    pool = LocalBackend(workers) if backend == "local" else RayBackend(ray_address, workers)
    try:
        plan = CostPlan(exp, screen(exp, expand(exp)), max(workers, 1)) if is_cost_search(exp) else None
        tasks = make_tasks(exp, scales if mode == "every_point" else None, plan)
        noun = "searches" if exp.search and (exp.search["combine"] == "median" or scales) else "points"
        # the recommended point's edge searches count from the start: the total does not grow at the end
        pending = edge_searches(exp, [t.point for t in tasks if not t.edge], scales) if mode == "recommended" else 0
        prior = sum(search_probes(exp.search, t.leader is not None) * len(t.seeds) for t in tasks) / len(tasks)
        meter = Progress(len(tasks) + pending, noun, runs_per_item=prior, enabled=progress).start()
        try:
            outcome = run_points(exp, staging, pool, meter, tasks)
            outcome.model_errors, outcome.plan = errors, plan
            best = recommended_points(exp, outcome) if mode == "recommended" else []
            more = edge_tasks(tasks, {p: scales[p] for p in best if p in scales})
            # fewer when the recommended point has no band (or none won); more when points tie for best
            meter.set_total(len(tasks) + len(more))
            if more:  # the recommended (or tied) points' model range, searched once every answer is known
                outcome = run_points(exp, staging, pool, meter, tasks + more, outcome.runs)
                outcome.model_errors, outcome.plan = errors, plan
        finally:
            meter.close()
    finally:
        pool.close()
    for stale in (staging / "runs").iterdir():  # runs of an earlier version of the experiment, dead temp dirs
        marker = read_marker(stale)
        if stale.name in outcome.runs:
            continue
        if marker is not None and marker["purpose"] == "tmp" and not alive(marker["pid"]):
            shutil.rmtree(stale, ignore_errors=True)
        elif is_result_set(stale):
            discard(stale)
    if write is not None:
        write(exp, outcome, staging)
    write_manifest(staging, {"experiment": str(exp.source), "runs": sorted(outcome.runs)})
    publish(staging, out)
    return outcome
