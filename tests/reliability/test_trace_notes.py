"""A trace field the layout does not read (and every other change the load made) is said once, by every command
that loads a trace file: `simulate`, `replay`, `validate` and `run` print the load report's lines as notes on
stderr, once per file, so `--json` stays one strict object on stdout."""

from __future__ import annotations

import json

import yaml

from kvplan.cli import main
from kvplan.traces.io import render
from kvplan.traces.synth import synthesize
from tests.endpoint.fakes import SPEC, Fake, fake_server

NOTE = "ignored 1 field the kvplan-jsonl layout does not read: 'colour'"


def coloured_trace(tmp_path, requests: int = 12) -> str:
    """The fakes' synthetic trace in kvplan's JSONL layout, each row with a field no layout reads."""
    rows = [json.loads(line) for line in render(synthesize({**SPEC, "requests": requests}), "jsonl").splitlines()]
    path = tmp_path / "coloured.jsonl"
    path.write_text("".join(json.dumps({**row, "colour": "red"}) + "\n" for row in rows))
    return str(path)


def test_the_unknown_field_note_names_the_field(tmp_path):
    from kvplan import traces

    assert traces.load(coloured_trace(tmp_path)).report.lines() == [NOTE]


def test_replay_says_once_which_fields_it_ignored(tmp_path, capsys):
    trace = coloured_trace(tmp_path)
    with fake_server(Fake("vllm")) as url:
        assert main(["replay", "--endpoint", url, "--trace", trace, "--vocab-size", "500", "--out",
                     str(tmp_path / "r"), "--json"]) == 0
    captured = capsys.readouterr()
    json.loads(captured.out)  # stdout stays one strict JSON object
    assert captured.err.count(NOTE) == 1 and f"note: {trace}: {NOTE}" in captured.err


def test_run_says_once_which_fields_its_trace_lacks_a_use_for(tmp_path, capsys):
    trace = coloured_trace(tmp_path, requests=40)
    doc = {"name": "notes", "model": "llama-3-8b", "hardware": "a100-40gb",
           "workload": {"trace": trace, "mode": "burst"}, "sweep": {"grid": {"engine.block_size": [8, 16]}},
           "slo": {"p99_ttft_ms": 2000}, "outputs": {"plots": False, "report": False}}
    path = tmp_path / "notes.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--json", "--quiet"]) == 0
    captured = capsys.readouterr()
    json.loads(captured.out)
    assert captured.err.count(NOTE) == 1  # two runs load the same file: one note
