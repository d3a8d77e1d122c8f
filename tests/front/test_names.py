"""Did-you-mean over full names (`engine.core.names`): a prefix or a family stem proposes the full names, a typo
the closest name of its family; every place that refuses a name uses it."""

from __future__ import annotations

import pytest

from kvplan.engine.core.names import did_you_mean, edits, suggestions
from kvplan.sim.specs.hardware import hardware_names
from kvplan.sim.specs.models import MODELS
from tests.badinput.contract import SAMPLE, refused

HARDWARE = hardware_names()

# (typed, the names proposed, in order)
TYPOS = [
    ("h100", ["h100-sxm"]),  # difflib proposed h200: one edit away, but another GPU
    ("H100", ["h100-sxm"]),
    ("h100-pcie", ["h100-sxm"]),  # the same family wins over a shorter edit into another
    ("a100", ["a100-40gb", "a100-80gb"]),
    ("a100-48gb", ["a100-40gb"]),
    ("l40", ["l40s"]),
    ("4090", ["rtx-4090"]),
    ("h300", ["h200"]),
    ("cpu", ["cpu-local"]),
    ("tpu-v5", []),
]
MODEL_TYPOS = [
    ("llama-3-70", ["llama-3-70b"]),
    ("llama-405b", ["llama-3.1-405b"]),  # its parts begin the name's parts, in order
    ("llama-70b", ["llama-3-70b", "llama-2-70b", "llama-3.1-70b"]),
    ("qwen3", ["qwen3-8b", "qwen3-32b", "qwen3-30b-a3b", "qwen3-235b-a22b"]),
    ("qwen-3-8b", ["qwen3-8b"]),
    ("deepseek", ["deepseek-v2-lite", "deepseek-v3"]),
    ("deepseek-v4", ["deepseek-v3"]),
    ("llaam-3-8b", ["llama-3-8b"]),  # a swapped pair of letters is one edit
    ("llama3-8b", ["llama-3-8b"]),
    ("llama-3-9b", ["llama-3-8b"]),
    ("mistral-7", ["mistral-7b"]),
    ("zzz", []),
]


@pytest.mark.parametrize(("typed", "expected"), TYPOS)
def test_hardware_typos(typed, expected):
    assert suggestions(typed, HARDWARE) == expected


@pytest.mark.parametrize(("typed", "expected"), MODEL_TYPOS)
def test_model_typos(typed, expected):
    assert suggestions(typed, MODELS) == expected


def test_setting_values_and_keys():
    assert suggestions("lur", ["fifo", "lfu", "lru", "s3fifo"]) == ["lru"]
    assert suggestions("float7", ["bfloat16", "float16", "float32"]) == ["float16", "float32"]  # a tie, shown
    assert suggestions("engin", ["engine", "workload"]) == ["engine"]
    assert suggestions("x" * 5000, ["x"]) == []


def test_the_phrase():
    assert did_you_mean("h100", HARDWARE) == "did you mean 'h100-sxm'? "
    assert did_you_mean("a100", HARDWARE) == "did you mean 'a100-40gb' or 'a100-80gb'? "
    llamas = [name for name in MODELS if name.startswith("llama")]
    assert did_you_mean("llama", MODELS) == (f"did you mean {', '.join(map(repr, llamas[:4]))} or one of "
                                             f"{len(llamas) - 4} more? ")
    assert did_you_mean("zzz", MODELS) == ""


def test_edits_count_a_swap_once():
    assert edits("lur", "lru") == 1
    assert edits("abc", "abc") == 0
    assert edits("", "abc") == 3
    assert edits("kitten", "sitting") == 3


@pytest.mark.parametrize(("argv", "said"), [
    (["--hardware", "h100"], "--hardware: unknown hardware 'h100'; did you mean 'h100-sxm'? allowed: a100-40gb"),
    (["--model", "qwen3"], "--model: unknown model 'qwen3'; did you mean 'qwen3-8b', 'qwen3-32b',"),
])
def test_the_cli_says_it_in_one_line(capsys, argv, said):
    line = refused(capsys, ["simulate", "--trace", SAMPLE, *argv], said)
    assert said in line


def test_an_experiment_says_it_too(capsys, tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text(f"name: x\nmodel: llama-3-8b\nhardware: a100\nworkload: {{trace: {SAMPLE}}}\n")
    line = refused(capsys, ["run", str(path), "--explain"], "hardware: unknown hardware 'a100'", tmp=tmp_path)
    assert "did you mean 'a100-40gb' or 'a100-80gb'? allowed: a100-40gb, a100-80gb, a10g" in line
