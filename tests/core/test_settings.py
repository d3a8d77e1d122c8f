"""One declaration per setting (engine.core.settings): every side that claims a setting reads it, and the core,
an experiment file, a --configs list and the command line refuse a bad value with the same message."""

from __future__ import annotations

import argparse
from dataclasses import fields

import pytest

from kvplan.engine.core import CacheConfig, SchedulerConfig
from kvplan.engine.core.settings import SETTINGS, Setting, for_side
from kvplan.engine.core.vllm_versions import NEWEST, VERSIONS
from kvplan.errors import ConfigError

CONFIGS = {"cache": CacheConfig, "scheduler": SchedulerConfig}
# A non-default value per setting, all consistent with each other (sinks need a window; swap needs CPU blocks).
CHANGED = {"block_size": 8, "num_blocks": 300, "num_cpu_blocks": 64, "kv_offloading_blocks": 32,
           "kv_offloading_size": 0.5, "kv_offloading_backend": "native", "kv_offloading_eviction": "fifo",
           "kv_disk_blocks": 48, "kv_shared_blocks": 40, "kv_shared_eviction": "lfu",
           "kv_offloading_write_through": True, "kv_offloading_layerwise": True, "enable_prefix_caching": False,
           "eviction_policy": "s3fifo", "allocator": "paged", "max_model_len": 200, "sink_tokens": 4,
           "window_tokens": 96, "watermark": 0.05, "max_num_batched_tokens": 96, "max_num_seqs": 7,
           "long_prefill_token_threshold": 32, "enable_chunked_prefill": False, "policy": "priority",
           "preemption_mode": "swap", "victim_policy": "longest_remaining", "schedule": "prefill_first",
           "scheduler_reserve_full_isl": False, "kv_cache_dtype": "int8", "gpu_memory_utilization": 0.5,
           "kv_cache_memory": 3 << 20, "swap_space": 2 << 20, "dtype": "float32", "position_mode": "shifted",
           "quantization": "awq", "tensor_parallel_size": 2, "pipeline_parallel_size": 2,
           "enable_expert_parallel": True, "entry_point": "llm", "api_server_latency_ms": 12.5, "vllm_version": "0.33",
           "cache_aware_admission_window": 0, "cache_aware_admission_threshold": 0.5,
           "speculative_config": '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2}',
           "enable_lora": True, "max_loras": 2, "max_lora_rank": 8, "max_cpu_loras": 3}
# `allocator` keeps its default above (a reservation allocator has no prefix cache, window or swap); its other
# values are covered by the simulator's reservation tests. `kv_offloading_backend` has one value kvplan models.
# The cache-aware window needs vLLM 0.34 and the fcfs policy, both changed above (tests/core/test_cache_aware.py
# sets it on every side).
CACHE_AWARE = {"cache_aware_admission_window", "cache_aware_admission_threshold"}
UNCHANGED = {"allocator", "kv_offloading_backend", *CACHE_AWARE}
# Given together with kv_offloading_blocks, a size must name the same blocks (tests/engine/test_cpu_tier.py and
# tests/sim/test_prefix_tiers_sim.py): the engine and the simulator are given the blocks alone here.
ALTERNATIVES = {"kv_offloading_size"}
# Speculative decoding refuses the sink+window cache set above (it rolls drafts back in place): the live engine is
# built with it in tests/engine/test_spec_decode.py.
NOT_WITH_WINDOW = {"speculative_config"}


def test_every_setting_has_a_changed_value_here_and_a_side():
    assert set(CHANGED) == set(SETTINGS), "a new setting needs a non-default value in CHANGED"
    for s in SETTINGS.values():
        assert s.sides and s.help and s.flag.startswith("--"), s.name
        assert s.name in UNCHANGED or CHANGED[s.name] != s.default, s.name
        assert ("core" in s.sides) == (s.config is not None), f"{s.name}: a core setting names its config"


def test_the_core_configs_are_exactly_the_core_settings():
    for config, cls in CONFIGS.items():
        declared = [s.name for s in SETTINGS.values() if s.config == config]
        assert [f.name for f in fields(cls)] == declared
        made = cls(**{n: CHANGED[n] for n in declared})
        assert all(getattr(made, n) == CHANGED[n] for n in declared)


def test_a_settings_class_declares_exactly_its_settings_in_order_with_their_types():
    from kvplan.engine.core.setting_classes import SETTING, config_fields, side_fields
    from kvplan.sim.spec import SimSpec

    wanted = [s.name for s in SETTINGS.values() if s.config == "scheduler"]
    body = {name: SETTING for name in wanted}
    right = {name: f.type for name, f in zip(wanted, fields(SchedulerConfig), strict=True)}
    wrong = {"missing": {k: v for k, v in right.items() if k != "policy"},
             "reordered": dict(reversed(right.items())),
             "mistyped": {**right, "max_num_seqs": "float"}}
    for why, declared in wrong.items():
        with pytest.raises(TypeError, match="must declare the scheduler settings"):
            config_fields("scheduler")(type(why, (), {**body, "__annotations__": declared}))
    made = config_fields("scheduler")(type("Right", (), {**body, "__annotations__": right}))
    assert all(getattr(made, n) == SETTINGS[n].default for n in wanted)
    # the simulator's side: None where the setting's `unset` gives it a meaning, and the side's default
    assert {f.name: f.type for f in fields(SimSpec)}["num_blocks"] == "int | None"
    assert SimSpec().num_blocks is None and SimSpec().block_size == VERSIONS[NEWEST].block_size  # vLLM's, on a GPU
    with pytest.raises(TypeError, match="must declare the sim settings"):
        side_fields("sim")(type("Bare", (), {"__annotations__": {"block_size": "int"}, "block_size": SETTING}))


class Reads:
    """An options object that records which settings were read."""

    def __init__(self, options: object) -> None:
        object.__setattr__(self, "_options", options)
        object.__setattr__(self, "read", set())

    def __getattr__(self, name: str) -> object:
        self.read.add(name)
        return getattr(self._options, name)


@pytest.mark.engine
def test_the_live_engine_reads_every_engine_setting(monkeypatch):
    from kvplan.engine import llm as llm_module
    from kvplan.engine.options import engine_options

    seen: list[Reads] = []

    def recording(settings: dict) -> Reads:
        seen.append(Reads(engine_options(settings)))
        return seen[-1]

    monkeypatch.setattr(llm_module, "engine_options", recording)
    engine_side = {s.name: CHANGED[s.name] for s in for_side("engine")
                   if s.name not in ALTERNATIVES and s.name not in NOT_WITH_WINDOW}
    # num_blocks is derived from kv_cache_memory when not given: read both ways
    llm = llm_module.LLM("tiny-llama", **{**engine_side, "num_blocks": None})
    first = seen[-1].read
    llm_module.LLM("tiny-llama", **engine_side)
    assert {s.name for s in for_side("engine")} <= first | seen[-1].read
    for config, made in (("cache", llm.scheduler.cache_config), ("scheduler", llm.scheduler.config)):
        for s in for_side("engine"):
            if s.config == config and s.name not in ("num_blocks", "max_model_len", *NOT_WITH_WINDOW):  # (derived)
                assert getattr(made, s.name) == CHANGED[s.name], s.name


# Simulator settings that change the step time but not the capacity, with a base configuration they act in.
STEP_TIME_ONLY = {"enable_expert_parallel": {"model": "qwen3-30b-a3b", "hardware": "h100-sxm",
                                             "tensor_parallel_size": 2}}
# Simulator settings that change how promotions from a prefix tier are priced (sim.links), with the tiers they act on
PROMOTION_ONLY = {"kv_offloading_layerwise": {"kv_offloading_blocks": 40}}
# what only a client of the API server measures (sim.frontend): the mean TTFT, not the engine
CLIENT_ONLY = {"api_server_latency_ms"}


def test_the_simulator_reads_every_sim_setting():
    from kvplan.sim.cost import StepFeatures
    from kvplan.sim.run import build_configs, build_cost
    from kvplan.sim.spec import SimSpec
    from kvplan.traces import Trace

    trace = Trace.build([0.0, 0.5], [40, 60], [5, 6])
    spec = SimSpec(model="llama-3-8b", hardware="a100-40gb",
                   **{s.name: CHANGED[s.name] for s in for_side("sim")
                      if s.name not in ALTERNATIVES and s.name not in NOT_WITH_WINDOW})
    cache, sched = build_configs(spec, trace, spec.num_blocks, build_cost(spec)[0])
    for s in for_side("sim"):
        if s.config is not None and s.name not in NOT_WITH_WINDOW:
            assert getattr({"cache": cache, "scheduler": sched}[s.config], s.name) == CHANGED[s.name], s.name
    for name in NOT_WITH_WINDOW:  # alone, without the window
        alone = SimSpec(model="llama-3-8b", hardware="a100-40gb", **{name: CHANGED[name]})
        cost, blocks = build_cost(alone)
        assert getattr(build_configs(alone, trace, blocks, cost)[1], name) == CHANGED[name]
    default = SimSpec(model="llama-3-8b", hardware="a100-40gb")
    for name in [s.name for s in for_side("sim")
                 if s.config is None and s.name not in STEP_TIME_ONLY and s.name not in PROMOTION_ONLY
                 and s.name not in ALTERNATIVES and s.name not in CLIENT_ONLY]:
        # the device's and the deployment shape's: they change the capacity
        assert build_cost(SimSpec(model="llama-3-8b", hardware="a100-40gb", **{name: CHANGED[name]}))[1] != \
            build_cost(default)[1], name
    # expert parallelism moves whole experts, not bytes: the same capacity, another step time (an MoE model on
    # two ranks: an all-to-all instead of an all-reduce)
    step = StepFeatures(64, 0, 0, 64, 64_000, 1000, 64 * 63, 64, 1)
    for name, base in STEP_TIME_ONLY.items():
        plain = build_cost(SimSpec(**base))[0]
        changed = build_cost(SimSpec(**base, **{name: CHANGED[name]}))[0]
        assert changed.step_times(step) != plain.step_times(step), name
    from kvplan.sim.run import simulate
    from tests.sim.test_prefix_tiers_sim import cycling_trace

    for name, tiers in PROMOTION_ONLY.items():
        runs = [simulate(cycling_trace(), SimSpec(num_blocks=12, block_size=16, max_model_len=128, **tiers,
                                                  **{name: value})).summary["mean_ttft_ms"]
                for value in (SETTINGS[name].default, CHANGED[name])]
        assert runs[0] != runs[1], name
    for name in CLIENT_ONLY:
        runs = [simulate(trace, SimSpec(num_blocks=64, **{name: value})).summary
                for value in (SETTINGS[name].default, CHANGED[name])]
        assert runs[0]["mean_ttft_ms"] != runs[1]["mean_ttft_ms"], name
        assert runs[0]["mean_ttft_engine_ms"] == pytest.approx(runs[1]["mean_ttft_engine_ms"]), name


def _flag_word(value: object) -> list[str]:
    return [str(value).lower() if isinstance(value, bool) else str(value)]


def _argv(side: str) -> list[str]:
    argv = []
    for s in for_side(side):
        if s.name in CACHE_AWARE:
            continue  # (only options whose component is configured may be written)
        value = CHANGED[s.name]
        if s.kind == "bool":
            argv.append(s.flag if value else "--no-" + s.flag[2:])
        else:
            argv += [s.flag, *_flag_word(value)]
    return argv


def test_every_command_line_reaches_its_side():
    from kvplan.commands.simulate import spec_from_args
    from kvplan.engine_args import add_engine_arguments, options_from_args
    from kvplan.settings_cli import add_setting_flags

    parser = argparse.ArgumentParser()
    add_setting_flags(parser, "sim", multiple=["block_size"])
    for extra in ("--trace", "--model", "--hardware", "--cost", "--profile", "--gpu-profile", "--replicas", "--router",
                  "--sample-interval"):
        parser.add_argument(extra)
    parser.add_argument("--no-fast-path", action="store_true")
    args = parser.parse_args(_argv("sim"))
    args.replicas = 1
    spec = spec_from_args(args, args.block_size[0])
    assert all(getattr(spec, s.name) == CHANGED[s.name] for s in for_side("sim"))
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    options = options_from_args(parser.parse_args(_argv("engine")))
    assert all(getattr(options, s.name) == CHANGED[s.name] for s in for_side("engine"))


def test_an_experiment_and_a_configs_list_reach_their_side(tmp_path):
    import yaml

    from kvplan.engine.options import EngineOptions
    from kvplan.engine_args import load_configs
    from kvplan.experiments.execute import build_spec
    from kvplan.experiments.schema import parse_experiment

    sim = {s.name: CHANGED[s.name] for s in for_side("sim") if s.name not in CACHE_AWARE}
    exp = parse_experiment({"name": "t", "engine": sim, "workload": {"trace": "sample:mooncake_style",
                                                                     "mode": "burst"}}, tmp_path / "e.yaml")
    spec = build_spec(exp.base)
    assert all(getattr(spec, name) == value for name, value in sim.items())
    engine = {s.name: CHANGED[s.name] for s in for_side("engine") if s.name not in CACHE_AWARE}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump([{"name": "a", **engine}]))
    [(_, options)] = load_configs(path, EngineOptions())
    assert all(getattr(options, name) == value for name, value in engine.items())


def _bad_values(s: Setting) -> list[object]:
    if s.kind == "int":
        return [v for v in (s.minimum - 1 if s.minimum is not None else None, (s.maximum or 0) + 1 if s.maximum
                            else None, 2.5, True) if v is not None]
    if s.kind == "float":
        return [float("nan"), (s.maximum or 0) + 1, -1.0 if s.minimum is not None or s.above is not None else None]
    if s.kind == "bool":
        return [2, "yes"]
    if s.kind == "choice":
        return ["nope", 3]
    return [0, "lots"]  # bytes


@pytest.mark.parametrize("name", list(SETTINGS))
def test_every_side_refuses_a_bad_value_with_the_same_message(name, tmp_path):
    import yaml

    from kvplan.engine.options import EngineOptions
    from kvplan.engine_args import load_configs
    from kvplan.experiments.schema import ENGINE
    from kvplan.settings_cli import flag_type

    s = SETTINGS[name]
    for value in [v for v in _bad_values(s) if v is not None]:
        tails = {}
        if s.config is not None:
            with pytest.raises(ConfigError) as core:
                CONFIGS[s.config](**{name: value})
            tails["core"] = str(core.value).split(": ", 1)[1]
        if "sim" in s.sides:
            with pytest.raises(ConfigError) as schema:
                ENGINE[name].check(value, f"engine.{name}")
            tails["yaml"] = str(schema.value).split(": ", 1)[1]
        if "engine" in s.sides:
            with pytest.raises(ConfigError) as options:
                EngineOptions(**{name: value})
            tails["options"] = str(options.value).split(": ", 1)[1]
            path = tmp_path / "c.yaml"
            path.write_text(yaml.safe_dump([{"name": "a", name: value}]))
            with pytest.raises(ConfigError) as configs:
                load_configs(path, EngineOptions())
            tails["configs"] = str(configs.value).split(f".{name}: ", 1)[1]
        if isinstance(value, int | float) and not isinstance(value, bool) and s.kind in ("int", "float"):
            with pytest.raises(argparse.ArgumentTypeError) as flag:
                flag_type(s)(str(value))
            tails["flag"] = str(flag.value)
        assert len(set(tails.values())) == 1, (value, tails)


def test_the_live_engine_refuses_a_shape_it_cannot_run():
    from kvplan.engine.options import engine_options

    with pytest.raises(ConfigError, match=r"tensor_parallel_size: 2: the live engine runs one model instance on one "
                                         r"device; allowed: 1 \(kvplan simulate --tensor-parallel-size prices it\)"):
        engine_options({"tensor_parallel_size": 2})
    assert engine_options({"pipeline_parallel_size": 1}) == engine_options({})
