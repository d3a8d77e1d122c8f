"""`kvplan bench beam` on tiny-llama: every run reports a saving in (0, 1) from its own unshared baseline, and beam
search - whose beams keep sharing what they had in common when they forked - saves more than parallel sampling,
which shares only the prompt."""

from __future__ import annotations

import json

import pytest

from kvplan.cli import main

TEXT = "The quick brown fox jumps over the lazy dog while the cat sleeps in the warm afternoon sun. " * 4


@pytest.mark.slow
def test_bench_beam_reports_the_saving_of_each_width(tiny_models, tmp_path, capsys):
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    assert main(["bench", "beam", "--model", tiny_models["tiny-llama"], "--text", str(text), "--requests", "2",
                 "--block-size", "4", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    runs = result["results"]
    assert sorted(runs) == sorted(f"{kind}_{w}" for kind in ("beam_search", "parallel_sampling") for w in (2, 4, 6))
    for run in runs.values():
        assert 0 < run["memory_saving"] < 1 and run["blocks_held"] < run["blocks_independent"]
        assert len(run["saving_per_step"]) == run["steps"] > 0
        assert run["min_step_saving"] <= run["memory_saving"] <= run["max_step_saving"]
    for width in (2, 4, 6):
        beam, parallel = runs[f"beam_search_{width}"], runs[f"parallel_sampling_{width}"]
        assert beam["memory_saving"] > parallel["memory_saving"] and beam["copy_on_write_copies"] > 0
    assert runs["beam_search_6"]["memory_saving"] > runs["beam_search_2"]["memory_saving"]


def test_bench_beam_refuses_a_missing_text(capsys, tmp_path):
    assert main(["bench", "beam", "--text", str(tmp_path / "nope.txt")]) == 2
    assert "--text" in capsys.readouterr().err
