"""llama.cpp's `/metrics` read under its own names (as tools/server/server-task.cpp of the vendored llama.cpp
writes them: `# HELP`, `# TYPE`, then `llamacpp:<name> <value>`), and what it does not export stays unknown."""

import math

from kvplan.endpoint import scrape, servers

LLAMACPP, VLLM = servers.ADAPTERS["llamacpp"], servers.ADAPTERS["vllm"]

_BEFORE = """# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 100
# TYPE llamacpp:prompt_tokens_cached_total counter
llamacpp:prompt_tokens_cached_total 10
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 40
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 3
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 2
"""
_AFTER = _BEFORE.replace(" 100", " 350").replace(" 10\n", " 70\n").replace(" 40\n", " 95\n")


def test_llamacpp_counters_are_read_and_differenced():
    start = servers.counters(LLAMACPP, scrape.parse(_BEFORE))
    end = servers.counters(LLAMACPP, scrape.parse(_AFTER))
    delta = scrape.difference(start, end)
    assert delta["prompt_tokens"] == 250.0
    assert delta["generation_tokens"] == 55.0
    assert delta["prefix_cache_hits"] == 60.0
    # llama.cpp counts no cache lookups, preemptions or successes: unknown, never 0
    for key in ("prefix_cache_queries", "num_preemptions", "request_success"):
        assert math.isnan(delta[key])


def test_llamacpp_gauges_fill_running_and_waiting_but_not_kv_usage():
    values, faults = servers.gauges(LLAMACPP, scrape.parse(_BEFORE), "GET http://x/metrics")
    assert faults == []
    assert values["running"] == 3.0 and values["waiting"] == 2.0
    assert math.isnan(values["kv_usage"]) and math.isnan(values["swapped"])


def test_vllm_name_wins_when_both_are_exposed():
    text = "vllm:prompt_tokens_total 7\nllamacpp:prompt_tokens_total 9\n"
    assert servers.counters(VLLM, scrape.parse(text))["prompt_tokens"] == 7.0
