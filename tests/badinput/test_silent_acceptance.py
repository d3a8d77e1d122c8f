"""Nothing is accepted silently (issue 44): two spellings of one setting, an option for a component that is not
configured, a value outside a setting's range under any spelling, and a search bound past what its variable
allows are each refused in one line naming what the user wrote - on the command line, in an experiment file, in a
`--configs` list and in the library. The cases are derived from the declarations (`engine.core.settings`,
`experiments.schema`), so a new setting, earlier name, component option or search target is covered here without
editing this file."""

from __future__ import annotations

import pytest
import yaml

from kvplan.engine.core.settings import KEY_ALIASES, NEEDS, ON, SETTINGS, Setting, for_side
from kvplan.errors import ConfigError
from kvplan.experiments.schema import INTEGER_TARGETS, SEARCH_TARGETS, SWEEPABLE
from tests.badinput.contract import SAMPLE, refused

BASE = {"name": "t", "model": "llama-3-8b", "hardware": "a100-40gb", "workload": {"trace": "sample:chat"}}
SIMULATE = ["simulate", "--trace", SAMPLE]
REPLAY = ["replay", "--model", "tiny-llama", "--trace", SAMPLE, "--out", "o"]


def valid(s: Setting) -> object:
    """A value the setting allows, away from its default where it has another (so that the library sees it)."""
    if s.kind == "choice":
        return next((c for c in s.choices if c != s.default), s.default)
    if s.kind == "bool":
        return not s.default
    if s.kind == "bytes":
        return 1 << 20
    if s.kind == "float":
        value = 0.5 if s.maximum is None or s.maximum >= 0.5 else s.maximum
        return value if value != s.default else value / 2
    candidates = [4 if s.maximum is None or s.maximum >= 4 else int(s.maximum), 8, 16, 1]
    return next(v for v in candidates if s.checker is None or s.checker(v) is None)  # (a number's own rule too)


def enabling(name: str) -> dict[str, object]:
    """The settings that configure the component `name` is an option of (its first way)."""
    other, wanted = NEEDS[name].any_of[0]
    value = wanted if wanted != ON else (True if SETTINGS[other].kind == "bool" else 1024)
    return {other: value}


def words(s: Setting, flag: str, value: object) -> list[str]:
    """`flag` with `value` on a command line (a bool flag, or an earlier `--no-x` spelling, takes none)."""
    if s.kind == "bool":
        return [flag if value or flag.startswith("--no-") else "--no-" + flag[2:]]
    return [flag, str(value)]


def command(s: Setting) -> list[str]:
    """A command line that takes the setting's flags and checks them before any work: simulate for what the
    simulator reads, replay (before loading a model) for the live engine's."""
    return SIMULATE if "sim" in s.sides else REPLAY


def experiment(tmp_path, **changes) -> str:
    path = tmp_path / "e.yaml"
    path.write_text(yaml.safe_dump({**BASE, **changes}, sort_keys=False))
    return str(path)


# --- two spellings of one setting ------------------------------------------------------------------------------
FLAG_ALIASES = [(s.name, alias) for s in SETTINGS.values() for alias in s.aliases]


@pytest.mark.parametrize(("name", "alias"), FLAG_ALIASES, ids=[a for _, a in FLAG_ALIASES])
def test_a_flag_and_its_earlier_spelling_together_are_refused(capsys, tmp_path, monkeypatch, name, alias):
    monkeypatch.chdir(tmp_path)
    s = SETTINGS[name]
    value = s.default if alias.startswith("--no-") else valid(s)  # `--no-x` sets false: the flag sets it too
    argv = [*command(s), *words(s, s.flag, value), *words(s, alias, value)]
    line = refused(capsys, argv, alias)
    assert s.flag in line and alias in line, line


KEYS = sorted(KEY_ALIASES.items())


@pytest.mark.parametrize(("old", "name"), KEYS, ids=[k for k, _ in KEYS])
def test_an_engine_section_with_both_names_is_refused(capsys, tmp_path, old, name):
    value = valid(SETTINGS[name])
    line = refused(capsys, ["run", experiment(tmp_path, engine={old: value, name: value}), "--explain"],
                   f"engine.{name}")
    assert f"engine.{old}" in line, line


@pytest.mark.parametrize(("old", "name"), KEYS, ids=[k for k, _ in KEYS])
@pytest.mark.parametrize("sections", [("grid", "grid"), ("grid", "zip"), ("zip", "zip")])
def test_a_sweep_listing_both_names_is_refused(capsys, tmp_path, old, name, sections):
    s = SETTINGS[name]
    sweep: dict = {}
    sweep.setdefault(sections[0], {})[f"engine.{old}"] = [valid(s)]
    sweep.setdefault(sections[1], {})[f"engine.{name}"] = [s.default]
    line = refused(capsys, ["run", experiment(tmp_path, sweep=sweep), "--explain"], f"engine.{name}")
    assert f"sweep.{sections[0]}.engine.{old}" in line and f"sweep.{sections[1]}.engine.{name}" in line, line


@pytest.mark.parametrize(("old", "name"), [(o, n) for o, n in KEYS if "engine" in SETTINGS[n].sides],
                         ids=[o for o, n in KEYS if "engine" in SETTINGS[n].sides])
def test_the_library_refuses_both_names_of_a_setting(old, name):
    """`LLM(model, **settings)` (`engine_options`): both names of one setting is a ConfigError naming both, not a
    TypeError and never one value dropped."""
    from kvplan.engine.options import engine_options

    value = valid(SETTINGS[name])
    with pytest.raises(ConfigError, match=rf"^{old}: sets {name}, which {name} already sets"):
        engine_options({name: value, old: value})


@pytest.mark.parametrize(("old", "name"), KEYS, ids=[k for k, _ in KEYS])
def test_a_configs_entry_with_both_names_is_refused(capsys, tmp_path, old, name):
    value = valid(SETTINGS[name])
    configs = tmp_path / "c.yaml"
    configs.write_text(yaml.safe_dump([{"name": "a", old: value, name: value}]))
    line = refused(capsys, ["validate", "--model", "tiny-llama", "--mode", "policy", "--trace", SAMPLE, "--configs",
                            str(configs), "--out", str(tmp_path / "v")], f"[0].{name}")
    assert f"[0].{old}" in line and not (tmp_path / "v").exists()


# --- a value out of range, named as written ----------------------------------------------------------------------
@pytest.mark.parametrize(("old", "name"), KEYS, ids=[k for k, _ in KEYS])
def test_a_bad_value_under_an_earlier_name_names_that_name(capsys, tmp_path, old, name):
    line = refused(capsys, ["run", experiment(tmp_path, engine={old: -1}), "--explain"], f"engine.{old}: ")
    assert f"engine.{name}" not in line, line
    line = refused(capsys, ["run", experiment(tmp_path, sweep={"grid": {f"engine.{old}": [-1]}}), "--explain"],
                   f"sweep.grid.engine.{old}[0]: ")


# --- options for a component that is not configured -------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(NEEDS))
def test_an_option_without_its_component_is_refused_on_the_command_line(capsys, tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    s = SETTINGS[name]
    # typed at its default too: a flag the user typed for a component that is not there is a mistake either way
    for value in {repr(v): v for v in (valid(s), s.default) if v is not None}.values():
        line = refused(capsys, [*command(s), *words(s, s.flag, value)], s.flag[2:])  # --x or --no-x
        assert NEEDS[name].component in line, line
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("name", sorted(n for n in NEEDS if "sim" in SETTINGS[n].sides))
def test_an_option_without_its_component_is_refused_in_an_experiment(capsys, tmp_path, name):
    line = refused(capsys, ["run", experiment(tmp_path, engine={name: valid(SETTINGS[name])}), "--explain"],
                   f"engine.{name}: needs {NEEDS[name].component}", tmp=tmp_path)
    other = NEEDS[name].any_of[0][0]
    assert f"engine.{other}" in line, line
    # in a sweep: a value no point gives the component is named by its index
    line = refused(capsys, ["run", experiment(tmp_path, sweep={"zip": {f"engine.{name}": [valid(SETTINGS[name])]}}),
                            "--explain"], f"sweep.zip.engine.{name}[0]: needs", tmp=tmp_path)


@pytest.mark.parametrize("name", sorted(n for n in NEEDS if "sim" in SETTINGS[n].sides))
def test_an_option_with_its_component_is_accepted(tmp_path, name):
    """The other side of the rule: with the component configured the file loads - in the base, or at the points
    of a sweep that give the option (a point that leaves both at their defaults is the baseline)."""
    from kvplan.commands.run import load

    value = valid(SETTINGS[name])
    [(other, on)] = enabling(name).items()
    load(experiment(tmp_path, engine={name: value, other: on}))
    load(experiment(tmp_path, sweep={"zip": {f"engine.{name}": [value, SETTINGS[name].default],
                                             f"engine.{other}": [on, SETTINGS[other].default]}}))


@pytest.mark.parametrize("name", sorted(n for n in NEEDS if "engine" in SETTINGS[n].sides
                                         and valid(SETTINGS[n]) != SETTINGS[n].default))
def test_the_library_refuses_an_option_without_its_component(name):
    """`LLM(**settings)`'s options (`engine_options`): an option away from its default for a component the same
    options do not configure."""
    from kvplan.engine.options import EngineOptions

    s = SETTINGS[name]
    with pytest.raises(ConfigError, match=rf"^{name}: needs {NEEDS[name].component}"):
        EngineOptions(**{name: valid(s)})
    EngineOptions(**{name: valid(s), **enabling(name)})


def test_every_component_option_is_declared_on_a_side_that_has_its_component():
    """A `needs` naming a setting no side of the option reads could never be met there."""
    for name, need in NEEDS.items():
        for side in SETTINGS[name].sides - {"core"}:
            names = {s.name for s in for_side(side)}
            assert any(other in names for other, _ in need.any_of), (name, side)


# --- beam search options ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(("extra", "where", "says"), [
    (["--beam-width", "0"], "--beam-width", "leave the flag out for no beam search"),
    (["--length-penalty", "0.5"], "--length-penalty", "needs beam search"),
    (["--beam-width", "2", "--temperature", "0.7"], "--temperature", "temperature=0"),
    (["--beam-width", "2", "--n", "2"], "--n", "n=1"),
    (["--beam-width", "2", "--top-k", "5"], "--top-k", "top_k=0"),
], ids=["width-0", "penalty-without-beams", "beams-with-temperature", "beams-with-n", "beams-with-top-k"])
def test_beam_options_are_refused_before_a_model_loads(capsys, extra, where, says):
    line = refused(capsys, ["generate", "--model", "no-such-model", "--prompt", "hi", *extra], where)
    assert says in line, line


# --- search bounds ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("target", sorted(SEARCH_TARGETS))
@pytest.mark.parametrize("end", ["low", "high"])
def test_a_search_end_past_its_variable_is_refused_naming_the_end(capsys, tmp_path, target, end):
    """`search.high: 1e12` users took gigabytes; a replica count past the limit blamed `cluster.replicas`, a key
    the file never wrote. Each end is checked by the bounds of the key the search varies."""
    field = SWEEPABLE[SEARCH_TARGETS[target]]
    assert field.maximum is not None, f"{SEARCH_TARGETS[target]} has no maximum"
    search = {"target": target, "low": 1, "high": field.maximum * 10}
    if end == "low":  # below the variable's smallest value (and a high it allows)
        smallest = field.minimum if field.minimum is not None else field.above
        search = {"target": target, "low": smallest / 10 if smallest else -1, "high": field.maximum}
        if target in INTEGER_TARGETS:  # counts (users, replicas): a fraction is refused first for not being one
            search["low"] = 0
    slo = {"attainment": {"ttft_ms": 1000, "fraction": 0.9}} if target == "max_goodput" else {"p99_ttft_ms": 1000}
    line = refused(capsys, ["run", experiment(tmp_path, slo=slo, search=search), "--explain"], f"search.{end}: ")
    assert SEARCH_TARGETS[target] in line or "> 0" in line, line  # a low of 0 is no search bound at all


def test_a_search_end_that_breaks_a_point_is_named(capsys, tmp_path):
    """A replica count within range that breaks the block limit only at the search's end: the message says it is
    the end the user wrote."""
    path = experiment(tmp_path, engine={"num_blocks": 40_000}, slo={"p99_ttft_ms": 1000},
                      search={"target": "min_replicas", "high": 4000})
    refused(capsys, ["run", path, "--explain"], "search.high 4000: ")


# --- corrupt profiles --------------------------------------------------------------------------------------------
PROFILE = "sim/profiles/cpu-local/llama-100m.yaml"


@pytest.mark.parametrize(("cost", "text", "says"), [
    ("calibrated", lambda good: good[: good.index("swap_seconds_per_block")], "cut short"),
    ("calibrated", lambda good: good.replace("  sampled:", "  # sampled:"), "coefficients.sampled"),
    ("recorded", lambda good: '{"meta": {}}\n', "no key 'block_size'"),
    ("recorded", lambda good: '{"meta": {"block_size": 16, "num_blocks": 1e30}}\n', "meta.num_blocks"),
    ("recorded", lambda good: '{"meta": [1]}\n', "not an object"),
], ids=["profile-truncated", "profile-missing-coefficient", "steps-no-header-fields", "steps-huge-blocks",
        "steps-header-list"])
def test_a_corrupt_profile_names_the_file_and_what_to_do(capsys, tmp_path, cost, text, says):
    from tests.badinput.contract import ROOT

    path = tmp_path / "p.yaml"
    path.write_text(text((ROOT / PROFILE).read_text()))
    line = refused(capsys, [*SIMULATE, "--cost", cost, "--profile", str(path)], str(path), tmp=tmp_path)
    assert says in line, line
    assert "rerun" in line or "kvplan replay" in line, line


def test_an_option_without_its_component_is_refused_in_a_configs_list(capsys, tmp_path):
    configs = tmp_path / "c.yaml"
    configs.write_text("- {name: a, kv_offloading_eviction: fifo}\n")
    line = refused(capsys, ["validate", "--model", "tiny-llama", "--mode", "policy", "--trace", SAMPLE, "--configs",
                            str(configs), "--out", str(tmp_path / "v")], "[0].kv_offloading_eviction: needs",
                   tmp=tmp_path)
    assert "[0].kv_offloading_blocks > 0" in line and not (tmp_path / "v").exists()


# --- every size has a maximum ----------------------------------------------------------------------------------
def test_every_numeric_size_and_search_bound_has_a_maximum():
    """Each integer setting, experiment key and search end is bounded by what it drives (limits.py: blocks,
    tokens, replicas, users): a number past it is refused before any work instead of exhausting memory."""
    from kvplan.experiments import schema

    sections = {"engine": schema.ENGINE, "cluster": schema.CLUSTER, "workload": {**schema.LOAD, **schema.TRACE_LOAD},
                "probe": schema.PROBE, "search": {"tolerance": schema.SEARCH["tolerance"]}}
    fields = {f"{section}.{key}": f for section, keys in sections.items() for key, f in keys.items()}
    fields |= {f"setting {s.name}": s for s in SETTINGS.values()}
    unbounded = [key for key, f in fields.items() if f.kind in ("int", "float") and f.maximum is None]
    assert not unbounded, unbounded
    for target, key in SEARCH_TARGETS.items():  # search.low/high take the varied key's bounds
        assert SWEEPABLE[key].maximum is not None, target
