"""Bad synth specs, calibrated profiles and config.json files: each is one clear line and exit code 2.

Every case runs the real CLI in-process (`kvplan trace synth`, `kvplan simulate --profile`, `kvplan simulate
--model`) and checks: exit code 2, the expected fragment (file, key path, problem), exactly one line on
stderr, no traceback. Inputs are written to tmp_path; the trace simulated is the bundled chat sample.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from kvplan.cli import main
from kvplan.traces.specs import SHOWN_CHARS, shown

ROOT = Path(__file__).resolve().parents[2]
TRACE = str(ROOT / "traces" / "samples" / "chat.jsonl")
VERBS = {"spec": "trace", "profile": "simulate", "config": "simulate"}

SPEC = """\
seed: 1
requests: 40
arrivals: {process: gamma, rate: 2.0, cv: 2.0}
lengths:
  prompt: {dist: lognormal, median: 300, sigma: 0.9, max: 4000}
  output: {dist: uniform, min: 16, max: 400}
prefix:
  granularity: 16
  system_prompts: {count: 4, tokens: {dist: fixed, value: 600}, zipf: 1.1}
  few_shot: {templates: 3, shots: 4, shot_tokens: {dist: fixed, value: 50}, fraction: 0.3}
  conversations: {fraction: 0.5, turns: {dist: uniform, min: 2, max: 5}, think_s: 20}
"""

PROFILE = """\
model: llama-100m
device: cpu-local
block_size: 16
block_sizes: [8, 16, 32]
kv_capacity_blocks: 341
coefficients: {step: 0.03, request: 0.005, prefill_tokens: 0.004, decode_requests: 0.002}
swap_seconds_per_block: 0.0004
copy_seconds_per_block: 0.0
provenance: {machine: test}
"""

CONFIG = {"hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3, "num_hidden_layers": 30,
          "intermediate_size": 1536, "vocab_size": 49152, "tie_word_embeddings": True,
          "max_position_embeddings": 8192}
DROP = object()  # a config() value that removes the key


def bomb() -> str:
    """Billion laughs as one flow sequence: nine levels of nine aliases, 9^9 strings once expanded."""
    names = "abcdefghi"
    parts = ['&a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    parts += [f"&{name} [{', '.join([f'*{prev}'] * 9)}]" for prev, name in itertools.pairwise(names)]
    return "[" + ", ".join(parts) + "]"


def _edit(text: str, old: str, new: str) -> str:
    assert old in text, old  # a case that edits nothing would test the valid base
    return text.replace(old, new, 1)


def spec(old: str, new: str) -> str:
    return _edit(SPEC, old, new)


def profile(old: str, new: str) -> str:
    return _edit(PROFILE, old, new)


def config(**changes: object) -> str:
    return json.dumps({k: v for k, v in {**CONFIG, **changes}.items() if v is not DROP})


# (case id, kind, content: str or bytes, expected fragment); the file is s.yaml, p.yaml or config.json.
YAML_CASES = [
    ("spec-syntax", "spec", "seed: [1\nrequests: 4\n", "s.yaml:2: not valid YAML: "),
    ("spec-python-tag", "spec", "seed: !!python/object/apply:os.system [echo hi]\n",
     "s.yaml:1: not valid YAML: could not determine a constructor for the tag"),
    ("spec-non-utf8", "spec", b"seed: 1\nrequests: caf\xe9\n", "s.yaml:2: not UTF-8 text (byte 0xe9)"),
    ("spec-nul-byte", "spec", "seed: 1\x00\n", "s.yaml:1: not valid YAML: unacceptable character"),
    ("spec-too-deep", "spec", "seed: " + "[" * 5000 + "]" * 5000 + "\n", "s.yaml:1: nested more than 100 deep"),
    ("spec-not-a-mapping", "spec", "- 1\n- 2\n", "s.yaml: spec: must be a mapping, got [1, 2]"),
    ("spec-alias-bomb", "spec", spec("requests: 40", f"requests: {bomb()}"),
     "s.yaml:2: alias *e takes the document past 200000 values with its aliases expanded"),
    ("spec-alias-bomb-mapping", "spec", spec("arrivals: {process: gamma, rate: 2.0, cv: 2.0}", f"arrivals: {bomb()}"),
     "s.yaml:3: alias *e takes the document past 200000 values with its aliases expanded"),
    ("profile-syntax", "profile", "coefficients: {step: 1\n", "p.yaml:2: not valid YAML: "),
    ("profile-python-tag", "profile", profile("model: llama-100m", "model: !!python/object:os.system {}"),
     "p.yaml:1: not valid YAML: could not determine a constructor"),
    ("profile-non-utf8", "profile", PROFILE.encode() + b"# \xff\n", "p.yaml:10: not UTF-8 text (byte 0xff)"),
    ("profile-alias-bomb", "profile", profile("kv_capacity_blocks: 341", f"kv_capacity_blocks: {bomb()}"),
     "p.yaml:5: alias *e takes the document past 200000 values with its aliases expanded"),
]

SYNTH_NUMBER_CASES = [
    ("rate-nan", "spec", spec("rate: 2.0", "rate: .nan"), "s.yaml: arrivals.rate: must be a finite number, got nan"),
    ("rate-inf", "spec", spec("rate: 2.0", "rate: .inf"), "arrivals.rate: must be a finite number, got inf"),
    ("rate-bool", "spec", spec("rate: 2.0", "rate: true"), "arrivals.rate: must be a number, got True"),
    ("rate-tiny", "spec", spec("rate: 2.0", "rate: 1.0e-300"), "arrivals.rate: must be >= 1e-06, got 1e-300"),
    ("cv-tiny", "spec", spec("cv: 2.0", "cv: 1.0e-300"), "arrivals.cv: must be >= 0.01, got 1e-300; allowed: "
                                                          "a number >= 0.01 and <= 10"),
    ("cv-huge", "spec", spec("cv: 2.0", "cv: 1000"), "arrivals.cv: must be <= 10, got 1000"),
    ("cv-string-exponent", "spec", spec("cv: 2.0", "cv: 1e-3"), "arrivals.cv: must be a number, got '1e-3' (a string"),
    ("sigma-nan", "spec", spec("sigma: 0.9", "sigma: .nan"), "lengths.prompt.sigma: must be a finite number, got nan"),
    ("sigma-huge", "spec", spec("sigma: 0.9", "sigma: 1.0e+10"), "lengths.prompt.sigma: must be <= 5"),
    ("median-inf", "spec", spec("median: 300", "median: .inf"), "lengths.prompt.median: must be a finite number"),
    ("uniform-min-above-max", "spec", spec("min: 16, max: 400", "min: 500, max: 400"),
     "lengths.output.max: must be >= min (500), got 400"),
    ("seed-fraction", "spec", spec("seed: 1", "seed: 1.5"), "spec.seed: must be an integer, got 1.5"),
    ("seed-negative", "spec", spec("seed: 1", "seed: -1"), "spec.seed: must be >= 0, got -1"),
    ("zipf-huge", "spec", spec("zipf: 1.1", "zipf: 1000"), "prefix.system_prompts.zipf: must be <= 10"),
    ("fraction-above-one", "spec", spec("fraction: 0.3", "fraction: 1.5"),
     "prefix.few_shot.fraction: must be in (0, 1]"),
    ("think-inf", "spec", spec("think_s: 20", "think_s: .inf"), "prefix.conversations.think_s: must be a finite"),
    ("curve-inf", "spec", spec("{process: gamma, rate: 2.0, cv: 2.0}", "{process: diurnal, rate: 1, curve: [1, .inf]}"),
     "arrivals.curve[1]: got inf; allowed: a non-empty list"),
    ("unknown-key-number", "spec", spec("seed: 1", "seed: 1\n7: x"), "s.yaml: spec.7: unknown key; allowed: seed"),
]

SYNTH_SIZE_CASES = [
    ("requests-huge", "spec", spec("requests: 40", "requests: 1000000000000"),
     "s.yaml: spec.requests: must be <= 10000000, got 1000000000000; allowed: an integer >= 1 and <= 10000000 "
     "(the generator holds every request in memory"),
    ("requests-huge-float", "spec", spec("requests: 40", "requests: 1.0e+12"), "spec.requests: must be <= 10000000"),
    ("turns-huge", "spec", spec("min: 2, max: 5", "min: 2, max: 1000000000000"),
     "prefix.conversations.turns.max: must be <= 1000, got 1000000000000"),
    ("tokens-huge", "spec", spec("{dist: fixed, value: 600}", "{dist: fixed, value: 1000000000000}"),
     "prefix.system_prompts.tokens.value: must be <= 16777216"),
    ("templates-huge", "spec", spec("templates: 3", "templates: 1000000000"),
     "prefix.few_shot.templates: must be <= 10000"),
    ("hash-ids-total", "spec", spec("requests: 40", "requests: 100000").replace("granularity: 16", "granularity: 1"),
     "s.yaml: spec.requests: these requests make "),
    ("segments-total", "spec", spec("requests: 40", "requests: 100000").replace(
        "{dist: uniform, min: 2, max: 5}", "{dist: fixed, value: 1000}").replace("fraction: 0.5", "fraction: 1"),
     "prompt segments (each turn repeats every earlier turn); allowed: at most 50000000"),
]

PROFILE_CASES = [
    ("step-negative", "profile", profile("step: 0.03", "step: -1.0"),
     "p.yaml: coefficients.step: must be a finite number of seconds >= 0, got -1.0"),
    ("step-nan", "profile", profile("step: 0.03", "step: .nan"), "p.yaml: coefficients.step: must be a finite number"),
    ("step-inf", "profile", profile("step: 0.03", "step: .inf"),
     "coefficients.step: must be a finite number of seconds"),
    ("step-bool", "profile", profile("step: 0.03", "step: true"), "coefficients.step: must be a finite number of "
                                                                  "seconds >= 0, got True"),
    ("step-string", "profile", profile("step: 0.03", "step: fast"), "coefficients.step: must be a finite number"),
    ("step-huge", "profile", profile("step: 0.03", "step: 1.0e+300"), "coefficients.step: 1e+300 seconds is not a "
                                                                      "measurement; allowed: 0 to 3600"),
    ("all-zero", "profile", profile("{step: 0.03, request: 0.005, prefill_tokens: 0.004, decode_requests: 0.002}",
                                    "{step: 0, request: 0.0}"), "p.yaml: coefficients: all zero would price"),
    ("unknown-feature", "profile", profile("step: 0.03", "warp: 0.03"), "coefficients.warp: unknown feature"),
    ("swap-inf", "profile", profile("swap_seconds_per_block: 0.0004", "swap_seconds_per_block: .inf"),
     "p.yaml: swap_seconds_per_block: must be a finite number"),
    ("capacity-zero", "profile", profile("kv_capacity_blocks: 341", "kv_capacity_blocks: 0"),
     "p.yaml: kv_capacity_blocks: must be an integer >= 1, got 0"),
    ("capacity-huge", "profile", profile("kv_capacity_blocks: 341", "kv_capacity_blocks: 100000000000"),
     "kv_capacity_blocks: must be an integer >= 1, got 100000000000; allowed: 1 to 16777216"),
    ("block-size-huge", "profile", profile("block_size: 16", "block_size: 1024"), "p.yaml: block_size: must be an "
                                                                                  "integer >= 1, got 1024"),
    ("block-size-bool", "profile", profile("block_size: 16", "block_size: true"), "block_size: must be an integer"),
    ("block-sizes-junk", "profile", profile("block_sizes: [8, 16, 32]", "block_sizes: [8, x]"),
     "p.yaml: block_sizes: "),
    ("provenance-scalar", "profile", profile("provenance: {machine: test}", "provenance: 3"),
     "p.yaml: provenance: must be a mapping, got 3"),
]

CONFIG_CASES = [
    ("top-level-list", "config", "[1, 2]", "config.json: a config.json is a JSON object with hidden_size"),
    ("heads-zero", "config", config(num_attention_heads=0),
     "config.json: num_attention_heads: must be an integer >= 1, got 0"),
    ("layers-negative", "config", config(num_hidden_layers=-2), "num_hidden_layers: must be an integer >= 1, got -2"),
    ("hidden-string", "config", config(hidden_size="576"), "hidden_size: must be an integer >= 1, got '576'"),
    ("layers-fraction", "config", config(num_hidden_layers=32.5),
     "num_hidden_layers: must be an integer >= 1, got 32.5"),
    ("layers-bool", "config", config(num_hidden_layers=True), "num_hidden_layers: must be an integer >= 1, got True"),
    ("hidden-not-divisible", "config", config(hidden_size=577), "hidden_size: 577 is not divisible by "
                                                                "num_attention_heads 9"),
    ("kv-heads-not-dividing", "config", config(num_key_value_heads=4), "num_key_value_heads: 4 does not divide "
                                                                       "num_attention_heads 9; allowed: 1, 3, 9"),
    ("vocab-nan", "config", config(vocab_size=float("nan")), "vocab_size: must be an integer >= 1, got nan"),
    ("vocab-huge", "config", config(vocab_size=10**12), "vocab_size: must be an integer >= 1, got 1000000000000"),
    ("tie-string", "config", config(tie_word_embeddings="false"), "tie_word_embeddings: must be true or false"),
    ("dtype-unknown", "config", config(torch_dtype="float64"),
     "torch_dtype: unknown dtype 'float64'; allowed: float32"),
    ("missing-key", "config", config(vocab_size=DROP), "config.json: config.json lacks 'vocab_size'"),
    ("invalid-json", "config", '{\n  "hidden_size": 576,\n  "x": }\n',
     "config.json:3:8: not valid JSON: Expecting value"),
    ("non-utf8", "config", b'{"name": "caf\xe9"}', "config.json:1: not UTF-8 text (byte 0xe9)"),
    ("context-bool", "config", config(max_position_embeddings=True), "max_position_embeddings: True; allowed: an "
                                                                     "integer >= 2"),
]

FILE_NAMES = {"spec": "s.yaml", "profile": "p.yaml", "config": "config.json"}
ALL_CASES = YAML_CASES + SYNTH_NUMBER_CASES + SYNTH_SIZE_CASES + PROFILE_CASES + CONFIG_CASES


def argv_for(kind: str, path: Path) -> list[str]:
    if kind == "spec":
        return ["trace", "synth", str(path)]
    if kind == "profile":
        return ["simulate", "--trace", TRACE, "--cost", "calibrated", "--profile", str(path)]
    return ["simulate", "--trace", TRACE, "--model", str(path)]


def one_line(capsys: pytest.CaptureFixture[str], kind: str, argv: list[str], fragment: str) -> str:
    """Run the CLI; assert exit 2 and a single traceback-free error line holding `fragment`; return the line."""
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"kvplan {VERBS[kind]}: error: "), err
    assert fragment in lines[0], err
    return lines[0]


def write(tmp_path: Path, kind: str, content: str | bytes) -> Path:
    path = tmp_path / FILE_NAMES[kind]
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return path


@pytest.mark.parametrize(("kind", "content", "fragment"), [c[1:] for c in ALL_CASES], ids=[c[0] for c in ALL_CASES])
def test_bad_input_is_one_clear_line(tmp_path, capsys, kind, content, fragment):
    line = one_line(capsys, kind, argv_for(kind, write(tmp_path, kind, content)), fragment)
    assert FILE_NAMES[kind] in line  # the message names the file
    assert len(line) < 600  # every quoted value is shortened, even an alias bomb's


@pytest.mark.parametrize("kind", ["spec", "profile", "config"])
def test_the_valid_bases_run(tmp_path, capsys, kind):
    """The corpus edits valid inputs: the bases themselves succeed, so each case fails for its own edit."""
    base = {"spec": SPEC, "profile": PROFILE, "config": config()}[kind]
    assert main(argv_for(kind, write(tmp_path, kind, base))) == 0, capsys.readouterr().err


@pytest.mark.parametrize("kind", ["spec", "profile"])
def test_a_directory_is_one_line(tmp_path, capsys, kind):
    one_line(capsys, kind, argv_for(kind, tmp_path), f"{tmp_path}: is a directory; allowed: a file")


def test_a_model_directory_without_config_json_is_one_line(tmp_path, capsys):
    one_line(capsys, "config", argv_for("config", tmp_path), f"--model: {tmp_path}: a directory without config.json")


@pytest.mark.parametrize("kind", ["spec", "profile", "config"])
def test_an_unreadable_file_is_one_line(tmp_path, capsys, monkeypatch, kind):
    path = write(tmp_path, kind, {"spec": SPEC, "profile": PROFILE, "config": config()}[kind])

    def denied(self: Path) -> bytes:  # chmod does not stop root, so the failure is injected
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_bytes", denied)
    one_line(capsys, kind, argv_for(kind, path), f"{path}: cannot read: Permission denied")


def test_a_missing_file_is_one_line(tmp_path, capsys):
    one_line(capsys, "spec", argv_for("spec", tmp_path / "absent.yaml"), "absent.yaml: no such file")
    one_line(capsys, "profile", argv_for("profile", tmp_path / "absent.yaml"), "absent.yaml: no such file")
    one_line(capsys, "config", argv_for("config", tmp_path / "absent.json"), "absent.json: no such file")


def test_shown_is_bounded_for_an_alias_bomb():
    import yaml

    value = yaml.safe_load(bomb())
    text = shown(value)
    assert len(text) <= SHOWN_CHARS and text.endswith("...")
    assert shown("x" * 10_000).count("x") < SHOWN_CHARS


def test_every_class_has_at_least_two_cases():
    for cases in (YAML_CASES, SYNTH_NUMBER_CASES, SYNTH_SIZE_CASES, PROFILE_CASES, CONFIG_CASES):
        assert len(cases) >= 2
