"""Before any run: resolve the files an experiment names and build every point once, so that a configuration
the simulator would reject fails now, naming its key path and point, instead of an hour into a sweep."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from kvplan.experiments.fields import SchemaError
from kvplan.experiments.points import Point, run_config
from kvplan.experiments.schema import Experiment

SAMPLE_PREFIX = "sample:"


def resolve_trace(value: str, base_dir: Path) -> str:
    from kvplan.traces.samples import bundled_traces

    if value.startswith(SAMPLE_PREFIX):
        name = value[len(SAMPLE_PREFIX):]
        samples = bundled_traces()
        if name not in samples:
            raise SchemaError(f"workload.trace: no bundled sample {name!r}; allowed: "
                              f"{', '.join(SAMPLE_PREFIX + s for s in samples)} (see `kvplan trace samples`)")
        return str(samples[name])
    path = (base_dir / value).resolve()
    if not path.is_file():
        raise SchemaError(f"workload.trace: {value}: no such file (relative to {base_dir}); allowed: a trace file "
                          f"or {SAMPLE_PREFIX}NAME")
    return str(path)


def resolve_model(value: str, where: str, base_dir: Path) -> str:
    from kvplan.sim.specs.models import MODELS, get_model, unknown_model

    if value in MODELS:
        return value
    path = (base_dir / value).resolve()
    if not path.exists():
        raise SchemaError(f"{where}: {unknown_model(value)}")
    try:
        get_model(str(path))
    except ValueError as exc:
        raise SchemaError(f"{where}: {str(exc).removeprefix('--model: ')}") from None
    return str(path)


def resolve_hardware(value: str, where: str, model: str, base_dir: Path) -> str:
    from kvplan.sim.cost.calibrated import load_profile
    from kvplan.sim.specs.hardware import HARDWARE, hardware_names
    from kvplan.sim.specs.profiles import PROFILED_DEVICES, shipped_profile

    if value in HARDWARE:
        return value
    if value in PROFILED_DEVICES:  # the simulator picks the model's shipped profile itself
        try:
            shipped_profile(model, value)
        except ValueError as exc:
            raise SchemaError(f"{where}: {str(exc).removeprefix('--hardware ')}") from None
        return value
    if value.endswith((".yaml", ".yml")):
        path = (base_dir / value).resolve()
        try:
            cost = load_profile(path)
        except (ValueError, FileNotFoundError) as exc:
            raise SchemaError(f"{where}: {exc}") from None
        from kvplan.sim.specs.profiles import profile_mismatch

        why = profile_mismatch(cost.meta.get("model"), model)
        if why:  # said before any run (the progress line comes later), as `simulate` says it
            print(f"note: {where}: {why}", file=sys.stderr)
        return str(path)
    from kvplan.engine.core.names import did_you_mean

    allowed = hardware_names()
    raise SchemaError(f"{where}: unknown hardware {value!r}; {did_you_mean(value, allowed)}allowed: "
                      f"{', '.join(allowed)}, or a calibrated profile (.yaml)")


def resolve(exp: Experiment) -> None:
    """Make every file the experiment names absolute (and checked), in the base and in the sweep."""
    base_dir = exp.source.parent
    workload = exp.base["workload"]
    if "trace" in workload:
        workload["trace"] = resolve_trace(workload["trace"], base_dir)
    for axes in (exp.sweep_grid, exp.sweep_zip):
        if "model" in axes:
            axes["model"] = [resolve_model(m, f"sweep.model[{i}]", base_dir) for i, m in enumerate(axes["model"])]
    exp.base["model"] = resolve_model(exp.base["model"], "model", base_dir)
    models = exp.sweep_grid.get("model") or exp.sweep_zip.get("model") or [exp.base["model"]]

    def hardware(value: str, where: str) -> str:  # checked against every model it may run with
        resolved = [resolve_hardware(value, where, model, base_dir) for model in models]
        return resolved[0]

    for axes in (exp.sweep_grid, exp.sweep_zip):
        if "hardware" in axes:
            axes["hardware"] = [hardware(h, f"sweep.hardware[{i}]") for i, h in enumerate(axes["hardware"])]
    exp.base["hardware"] = hardware(exp.base["hardware"], "hardware")


def key_path(message: str) -> str:
    """A simulator message in the experiment's terms: the core's config paths (cache.x, scheduler.x) and the
    command-line flags of settings (`--block-size`, `--no-enable-prefix-caching`) become key paths
    (engine.block_size)."""
    from kvplan.engine.core.settings import SETTINGS
    from kvplan.experiments.schema import CLUSTER

    message = re.sub(r"\b(?:cache|scheduler)\.(?=[a-z_]+)", "engine.", message)
    for s in SETTINGS.values():
        if s.kind == "bool":
            message = message.replace("--no-" + s.flag[2:], f"engine.{s.name}: false")
    if not message.startswith("--"):
        return message
    flag, _, rest = message.partition(":")
    names = {spelling: s.name for s in SETTINGS.values() for spelling in (s.flag, *s.aliases)}
    if flag in names:
        return f"engine.{names[flag]}:{rest}"
    name = flag[2:].replace("-", "_")
    return f"{'workload' if name == 'trace' else 'cluster.' + name if name in CLUSTER else name}:{rest}"


def check_point(exp: Experiment, point: Point):  # -> traces.Trace
    """Build the point's workload and simulator exactly as its first run will (nothing is simulated); returns the
    workload as built (at the search's high end)."""
    from kvplan.experiments.execute import build_probe, build_spec, build_trace
    from kvplan.experiments.pd_block import varied_key
    from kvplan.sim.frontend import frontend_for
    from kvplan.sim.run import build_configs, build_cost, check_trace
    from kvplan.traces.steady import population

    varied = varied_key(exp, point.config)
    ends = {f"search.{end} {exp.search[end]:g}: ": {varied: exp.search[end]} for end in ("low", "high")} \
        if exp.search else {"": None}
    end = ""
    try:
        for end in ends:  # a search's two ends bound every value it will probe
            config = run_config(point.config, exp.seeds[0], ends[end])
            trace = build_trace(config)
            check_trace(trace, "the workload")
            spec = build_spec(config)
            frontend_for(spec.entry_point, spec.api_server_latency_ms)  # a latency without an API server
            cost, num_blocks = build_cost(spec)
            build_configs(spec, trace, num_blocks, cost)
            if config["workload"]["mode"] != "burst":  # a rate to offer, a window to measure, room for both
                build_probe(config).check(population(trace))
    except (ValueError, FileNotFoundError) as exc:
        # at a search's end, that end is what the user wrote (the varied key is not in the file)
        raise SchemaError(f"point {point.index} ({point.label}): {end}{key_path(str(exc))}") from None
    return trace
