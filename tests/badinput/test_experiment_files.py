"""The bad-input corpus for experiment YAML (`kvplan run`): YAML that is not YAML, unsafe tags, a directory, an
alias bomb, sizes that would exhaust memory and cross-field facts. Each exits 2 with one line naming the file
and the key path, and no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvplan.cli import main

BASE = 'name: t\nmodel: llama-3-8b\nhardware: a100-40gb\nworkload: {trace: "sample:chat"}\n'


def _alias_bomb() -> str:
    """Nine levels of nine aliases: 387 million strings once expanded (a billion-laughs document)."""
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for level in range(1, 10):
        lines.append(f"a{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * 9) + "]")
    return "\n".join(lines) + "\nname: *a9\n"


def _nested_bomb() -> str:
    """The same expansion inside one value: a list whose items define the anchors the next items repeat."""
    items = ['&b0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    items += [f"&b{level} [" + ", ".join([f"*b{level - 1}"] * 9) + "]" for level in range(1, 10)]
    return "[" + ", ".join(items) + "]"


CASES = [
    ("syntax-error", "name: [x\n", "e.yaml:2: not valid YAML"),
    ("bad-indent", "name: t\n  model: x\n", "e.yaml:2: not valid YAML"),
    ("python-tag", 'name: !!python/object/apply:os.system ["true"]\n', "could not determine a constructor for the tag"),
    ("python-name-tag", "name: !!python/name:os.system\n", "could not determine a constructor for the tag"),
    ("alias-bomb-key", _alias_bomb(), "e.yaml:6: alias *a4 takes the document past 200000 values"),
    ("alias-bomb-value", BASE + "description: " + _nested_bomb() + "\n",
     "e.yaml:5: alias *b4 takes the document past 200000 values"),
    ("huge-num-blocks", BASE + "engine: {num_blocks: 100000000000}\n",
     "engine.num_blocks: must be an integer >= 1 and <= 50000000 (one object per KV block: more would "
     "exhaust memory), got 100000000000"),
    ("huge-cpu-blocks", BASE + "engine: {num_cpu_blocks: 100000000000, preemption_mode: swap}\n",
     "engine.num_cpu_blocks: must be an integer >= 0 and <= 50000000"),
    ("replicas-times-blocks", BASE + "cluster: {replicas: 4000}\nengine: {num_blocks: 40000}\n",
     "point 0 (base): engine.num_blocks: 4000 replicas x (40000 + 0 CPU) = 160000000 KV blocks"),
    ("sink-above-window", BASE + "engine: {sink_tokens: 64, window_tokens: 16}\n",
     "point 0 (base): engine.sink_tokens: 64 exceeds engine.window_tokens 16"),
    ("max-model-len-above-context", BASE + "engine: {max_model_len: 100000}\n",
     "point 0 (base): engine.max_model_len: 100000 exceeds llama-3-8b's context length 8192"),
    ("bool-replicas", BASE + "cluster: {replicas: true}\n", "cluster.replicas: must be an integer"),
    ("nan-rate-scale", BASE.replace('"sample:chat"}', '"sample:chat", rate_scale: .nan}'),
     "workload.rate_scale: must be a finite number"),
    ("format-typo", BASE.replace('"sample:chat"}', '"sample:chat", format: jsnl}'),
     "workload.format: unknown value 'jsnl'"),
]


@pytest.mark.parametrize(("text", "fragment"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_experiment_files(tmp_path, capsys, text, fragment):
    path = tmp_path / "e.yaml"
    path.write_text(text)
    code = main(["run", str(path), "--explain"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert fragment in err, err
    assert len(err) < 2000  # an alias bomb's value is quoted short, never expanded into the message


def test_an_experiment_path_that_is_a_directory(tmp_path, capsys):
    folder = Path(tmp_path / "exp.yaml")
    folder.mkdir()
    assert main(["run", str(folder), "--explain"]) == 2
    err = capsys.readouterr().err
    assert "exp.yaml: is a directory; allowed: a file" in err and "Traceback" not in err
