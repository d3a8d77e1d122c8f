"""Server adapters against fake servers that answer as each real one documents: detection, the KV configuration
read, `--server` overriding detection, counters under each server's names, llama.cpp's memory model in the
simulator, and the per-request cached-token counts."""

from __future__ import annotations

import json

import pytest

from kvplan.cli import main
from kvplan.endpoint.servers import probe
from kvplan.endpoint.session import simulator_config
from kvplan.engine.options import EngineOptions
from kvplan.output import verify_result_set
from tests.endpoint.fakes import Fake, fake_server, write_trace

EXPECTED = {
    "llamacpp": dict(block_size=1, num_blocks=4 * 512, max_model_len=512, max_num_seqs=4,
                     enable_prefix_caching=False, allocator="max", source="/props"),
    "sglang": dict(block_size=1, num_blocks=3000, max_model_len=2048, max_num_seqs=8, enable_prefix_caching=True,
                   allocator="paged", source="/get_server_info"),
    "tgi": dict(block_size=1, num_blocks=4096, max_model_len=1024, max_num_seqs=16, enable_prefix_caching=None,
                allocator="paged", source="/info"),
    "vllm": dict(block_size=16, num_blocks=200, max_model_len=1024, max_num_seqs=None, enable_prefix_caching=True,
                 allocator="paged", source="/metrics vllm:cache_config_info"),
}


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_each_server_is_detected_and_its_kv_configuration_read(kind):
    with fake_server(Fake(kind)) as url:
        found = probe(url)
    assert found.adapter.kind == kind
    assert found.kv.to_json() == EXPECTED[kind]
    assert found.adapter.not_exposed  # every server hides something, and says what


def test_server_option_overrides_detection():
    with fake_server(Fake("llamacpp")) as url:
        forced = probe(url, "tgi")  # a TGI adapter reads /info, which this server does not answer
    assert forced.adapter.kind == "tgi" and forced.detected == "--server tgi"
    assert forced.kv.num_blocks is None and forced.kv.source == ""


def test_llamacpp_is_simulated_as_slots_of_contiguous_reservations():
    with fake_server(Fake("llamacpp")) as url:
        kv = probe(url).kv
    options, meta = simulator_config(kv, EngineOptions(), "smollm2-135m")
    assert options.max_num_seqs == 4 and options.enable_prefix_caching is False and options.block_size == 1
    assert meta["allocator"] == "max" and meta["max_model_len"] == 512 and meta["num_blocks"] == 2048


@pytest.mark.parametrize("kind", ["llamacpp", "sglang", "tgi"])
def test_a_replay_reads_each_servers_counters_and_records_what_it_is(kind, tmp_path, capsys):
    # the server counts a request 0.2 s after its last byte: the closing scrape waits for the counters to settle
    fake = Fake(kind, count_lag_s=0.2)
    out = tmp_path / "r"
    with fake_server(fake) as url:
        assert main(["replay", "--endpoint", url, "--trace", write_trace(tmp_path), "--vocab-size", "500",
                     "--out", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    verify_result_set(out)
    endpoint = json.loads((out / "endpoint.json").read_text())
    assert endpoint["server"]["kind"] == kind and endpoint["server"]["kv_config"] == EXPECTED[kind]
    assert endpoint["server_counters"]["generation_tokens"] == fake.generated > 0
    assert endpoint["server_counters"]["prompt_tokens"] == fake.prompted
    hits = doc["summary"]["prefix_cache_hits"]
    assert hits == (None if kind == "tgi" else fake.cached)  # TGI exports no cached-token counter: unknown
    # the per-request counts (usage cached_tokens, llama.cpp's timings.cache_n), summed
    assert doc["info"]["reported_cached_tokens"] == fake.cached
    if kind == "llamacpp":  # kvplan asks llama.cpp to reuse nothing, as its simulation (prefix caching off)
        assert all(body["cache_prompt"] is False for body in fake.bodies) and fake.cached == 0
    else:
        assert all("cache_prompt" not in body for body in fake.bodies) and fake.cached > 0


# kind, the info document's change, what the one line names: a published KV fact is exact or refused
BAD_FACTS = [
    ("sglang", {"page_size": "16"}, "page_size: '16' is not an integer"),
    ("sglang", {"disable_radix_cache": "yes"}, "disable_radix_cache is 'yes'; allowed: a boolean"),
    ("sglang", {"max_total_num_tokens": 0}, "max_total_num_tokens: 0 is out of range"),
    ("tgi", {"max_batch_total_tokens": 16.5}, "max_batch_total_tokens: 16.5 is not an integer"),
    ("tgi", {"max_concurrent_requests": -1}, "max_concurrent_requests: -1 is out of range"),
    ("llamacpp", {"total_slots": True}, "total_slots: True is not an integer"),
    ("llamacpp", {"default_generation_settings": {"n_ctx": 10**30}}, "n_ctx: 1000000000000000000000000000000 is "
                                                                     "out of range"),
]


@pytest.mark.parametrize(("kind", "change", "message"), BAD_FACTS)
def test_a_bad_kv_fact_is_refused_as_the_servers(kind, change, message, monkeypatch):
    from kvplan.endpoint.http_limits import ServerFault
    from tests.endpoint import fakes

    path, doc = fakes.INFO[kind]
    monkeypatch.setitem(fakes.INFO, kind, (path, {**doc, **change}))
    with fake_server(Fake(kind)) as url, pytest.raises(ServerFault) as caught:
        probe(url)
    assert message in str(caught.value) and f"(from GET {url}{path})" in str(caught.value), str(caught.value)
    assert str(caught.value).startswith("the server sent a bad value: ")
