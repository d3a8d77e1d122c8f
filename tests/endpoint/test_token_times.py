"""The token timing rule for servers that stream text without token ids: counted per chunk, checked against the
usage; when the count does not add up the request's gaps are approximate and kept out of the ITL distribution,
and a tokenizer re-counts each chunk's tokens exactly."""

from __future__ import annotations

import json

import pytest

from kvplan.cli import main
from kvplan.endpoint.loadgen import LoadGenerator
from kvplan.endpoint.prompts import EndpointRequest
from kvplan.endpoint.servers import ADAPTERS
from kvplan.errors import UserError
from tests.endpoint.fakes import Fake, fake_server, write_trace


class _WordTokenizer:
    """One token per space-led word, as the fake server's " a" chunks are."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [1] * len(text.split())


def _run(fake: Fake, tokenizer=None):
    with fake_server(fake) as url:
        generator = LoadGenerator(url, None, temperature=0.0, adapter=ADAPTERS[fake.kind], tokenizer=tokenizer,
                                  progress=lambda line: None)
        return generator.run([EndpointRequest(0, 0.0, [5] * 20, 20, 9)]).outcomes[0]


def test_one_token_per_text_chunk_is_exact_when_it_adds_up():
    outcome = _run(Fake("tgi", tokens_per_chunk=1))
    assert outcome.error is None and not outcome.gaps_approximate
    assert len(outcome.token_times[0]) == 9 and len(set(outcome.token_times[0])) == 9


def test_chunks_carrying_several_tokens_make_the_gaps_approximate():
    outcome = _run(Fake("tgi", tokens_per_chunk=3))
    assert outcome.error is None and outcome.gaps_approximate  # 3 chunks for 9 tokens: 6 stamped at the finish
    assert len(outcome.token_times[0]) == 9


def test_a_tokenizer_recounts_each_chunk():
    outcome = _run(Fake("tgi", tokens_per_chunk=3), tokenizer=_WordTokenizer())
    assert outcome.error is None and not outcome.gaps_approximate
    times = outcome.token_times[0]
    assert len(times) == 9 and len(set(times)) == 3  # three chunks of three tokens, each stamped when read


def test_vllm_token_ids_are_exact_whatever_the_chunking():
    outcome = _run(Fake("vllm", tokens_per_chunk=3))
    assert not outcome.gaps_approximate and len(outcome.token_ids[0]) == 9


def test_approximate_gaps_are_left_out_of_itl_and_said(tmp_path, capsys):
    out = tmp_path / "r"
    with fake_server(Fake("sglang", tokens_per_chunk=2)) as url:
        assert main(["replay", "--endpoint", url, "--trace", write_trace(tmp_path), "--vocab-size", "500",
                     "--out", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["info"]["approximate_gap_requests"] == doc["summary"]["completed"] > 0
    assert doc["summary"]["median_itl_ms"] is None  # no exact gap at all: unknown, not a made-up one
    assert doc["summary"]["median_tpot_ms"] > 0  # first and last token times stay exact
    assert json.loads((out / "endpoint.json").read_text())["approximate_gap_requests"] == doc["summary"]["completed"]
    line = json.loads((out / "tokens.jsonl").read_text().splitlines()[0])
    assert line["gaps_approximate"] is True


def test_a_bad_drift_probe_file_is_one_clear_error(tmp_path):
    from kvplan.commands.calibrate import _probe_seconds

    path = tmp_path / "probe.json"
    path.write_text('{"seconds": -1}')
    with pytest.raises(UserError, match="seconds -1; allowed: a positive number or null"):
        _probe_seconds(path)
    path.write_text('{"seconds": 0.5}')
    assert _probe_seconds(path) == 0.5
