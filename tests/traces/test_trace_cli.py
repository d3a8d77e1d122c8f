"""`kvplan trace stats|convert|synth` end to end on generated fixtures."""

from __future__ import annotations

import json

import pytest
import yaml

from kvplan import traces
from kvplan.cli import main
from tests.traces.test_trace_synth import SPEC
from tests.traces.trace_fixtures import AZURE_2023, MOONCAKE, write_jsonl, write_text


def _json(capsys) -> dict:
    return json.loads(capsys.readouterr().out)


def test_stats_json_and_text(tmp_path, capsys):
    path = write_jsonl(tmp_path, "m.jsonl", MOONCAKE)
    assert main(["trace", "stats", str(path), "--json"]) == 0
    summary = _json(capsys)
    assert summary["requests"] == 3 and summary["format"] == "mooncake"
    # Request 1 reuses block 0 (512 tokens); request 2 reuses blocks 0-11 of request 0.
    assert summary["prefix"]["hit_tokens"] == 512 + 12 * 512
    assert summary["prefix"]["unique_blocks"] == 18
    assert summary["prompt_tokens"]["max"] == 6955 and summary["duration_s"] == 3.0
    assert main(["trace", "stats", str(path)]) == 0
    text = capsys.readouterr().out
    assert "prefix reuse (infinite cache, 512-token blocks): 45.15% of prompt tokens (6656 of 14743)" in text


def test_convert_applies_transforms_and_round_trips(tmp_path, capsys):
    path = write_jsonl(tmp_path, "m.jsonl", MOONCAKE)
    out = tmp_path / "out" / "m16.csv"
    assert main(["trace", "convert", str(path), str(out), "--expand-block", "16", "--rate-scale", "2",
                 "--json"]) == 0
    summary = _json(capsys)
    assert summary["written_format"] == "csv" and summary["prefix"]["hash_granularity"] == 16
    loaded = traces.load(out)
    assert loaded.hash_granularity == 16 and loaded.arrival_s.tolist() == [0.0, 0.0, 1.5]
    assert list(tmp_path.joinpath("out").iterdir()) == [out]  # nothing but the result (atomic write)


def test_synth_writes_a_loadable_trace(tmp_path, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    out = tmp_path / "s.parquet"
    assert main(["trace", "synth", str(spec), "-o", str(out), "--json"]) == 0
    assert _json(capsys)["requests"] == 300
    assert len(traces.load(out)) == 300


def test_bad_input_exits_2_naming_file_and_line(tmp_path, capsys):
    path = write_text(tmp_path, "a.csv", AZURE_2023.replace(",396,", ",-396,"))
    assert main(["trace", "stats", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kvplan trace: error: {path}:3: ContextTokens -396 is out of range")
    assert main(["trace", "stats", str(path), "--skip-bad"]) == 0
    assert "note: dropped 1 bad rows (--skip-bad), first at lines 3" in capsys.readouterr().out


def test_bad_synth_spec_names_the_key(tmp_path, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({**SPEC, "arrivals": {"process": "gamma", "rate": 1, "cv": -1}}))
    assert main(["trace", "synth", str(spec)]) == 2
    assert "arrivals.cv: must be > 0" in capsys.readouterr().err


@pytest.mark.parametrize("action", ["stats", "convert", "synth"])
def test_every_action_has_help(action, capsys):
    assert main(["trace", action, "--help"]) == 0
    assert "usage: kvplan trace" in capsys.readouterr().out
