"""Issue 44's fault-injection suite: a server that drips, stalls, streams keep-alives or endless lines, nests its
JSON 100,000 deep, or sends values against their meaning (tests/reliability/fault_server.py), driven through
`kvplan replay --endpoint`, `kvplan validate --endpoint` and `kvplan bench serve`. Every case ends within
2x --timeout, either with one line naming the server's URL and what it did (exit 2), or completed with the bad
values excluded from the result and counted in it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvplan.cli import main
from kvplan.endpoint.local_server import ServerStartError, wait_healthy
from tests.endpoint.fakes import profile
from tests.reliability.fault_server import fault_server

TIMEOUT_S = 1.0


def _trace(tmp_path: Path) -> str:
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"request_id": i, "arrival_s": i * 0.01, "prompt_tokens": 8,
                                        "output_tokens": 3}) + "\n" for i in range(2)))
    return str(path)


def _one_line(capsys, command: str) -> str:
    """The command's single error line (no traceback, nothing else reported as an error)."""
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    errors = [line for line in err.splitlines() if line.startswith(f"kvplan {command}: error:")]
    assert len(errors) == 1 and err.strip().splitlines()[-1] == errors[0], err
    return errors[0]


def _replay(url: str, tmp_path: Path, *extra: str) -> tuple[int, float]:
    start = time.monotonic()
    code = main(["replay", "--endpoint", url, "--trace", _trace(tmp_path), "--vocab-size", "500", "--timeout",
                 str(TIMEOUT_S), "--out", str(tmp_path / "r"), *extra])
    return code, time.monotonic() - start


@pytest.fixture(scope="module", autouse=True)
def served_when_nothing_is_wrong(tmp_path_factory):
    """The fake server in mode "ok" serves a replay whole (so each fault below is the only thing wrong), and
    the replay's modules are imported before any case is timed: the deadlines bound waiting, not start-up."""
    tmp_path = tmp_path_factory.mktemp("ok")
    with fault_server("ok") as (url, state):
        code, _ = _replay(url, tmp_path, "--reset-prefix-cache", "--json")
    info = json.loads((tmp_path / "r" / "summary.json").read_text())["info"]
    assert code == 0 and state.completions == 2
    assert info["failed"] == 0 and info["server_faults"] == {} and info["num_blocks"] == 200


# mode -> (extra options, what the one line says); {url} is the fake server's URL
REFUSED = {
    "drip": ((), "every request failed (first: request_id 0 (t.jsonl:1): POST {url}/v1/completions: no complete "
                 "answer within 1 s"),
    "drip-headers": ((), "POST {url}/v1/completions: no complete answer within 1 s"),
    "stall": ((), "every request failed (first: request_id 0 (t.jsonl:1): POST {url}/v1/completions: no complete "
                  "answer within 1 s"),
    "keep-alive": ((), "POST {url}/v1/completions: no complete answer within 1 s"),
    "drip-error": ((), "POST {url}/v1/completions: no complete answer within 1 s"),
    "endless-line": ((), "POST {url}/v1/completions: a line longer than 1048576 bytes"),
    "deeply-nested": ((), "every request failed (first: request_id 0 (t.jsonl:1): HTTP 500: [[[["),
    "drip-models": ((), "GET {url}/v1/models: no complete answer within 1 s"),
    "huge-models": ((), "GET {url}/v1/models: a body larger than 16777216 bytes"),
    "drip-metrics": ((), "GET {url}/metrics: no complete answer within 1 s"),
    "drip-reset": (("--reset-prefix-cache",), "POST {url}/reset_prefix_cache: no complete answer within 1 s"),
    "bad-kv-block": ((), "vllm:cache_config_info label block_size: '16.5' is not an integer; allowed: an integer "
                         ">= 1 and <= 65536 (from GET {url}/metrics)"),
    "bad-kv-caching": ((), "vllm:cache_config_info label enable_prefix_caching is 'yes'; allowed: a boolean "
                           '("True" or "False") '
                           "(from GET {url}/metrics)"),
    "small-kv": ((), "vllm:cache_config_info label num_gpu_blocks: 0 is out of range"),
}


@pytest.mark.parametrize("mode", sorted(REFUSED))
def test_a_faulty_server_is_one_line_within_twice_the_timeout(mode, tmp_path, capsys):
    extra, message = REFUSED[mode]
    with fault_server(mode) as (url, _):
        code, took = _replay(url, tmp_path, *extra)
    line = _one_line(capsys, "replay")
    assert code == 2 and message.format(url=url) in line, line
    assert took < 2 * TIMEOUT_S, took
    if "every request failed" in line:  # the replay ran: each failure is kept with its reason
        failed = [json.loads(row) for row in (tmp_path / "r" / "failed.jsonl").open()]
        assert len(failed) == 2 and all(f["reason"] in ("timeout", "too_large", "http") for f in failed)
    else:  # refused before the first request: nothing written
        assert not (tmp_path / "r").exists()


# mode -> (extra options, failed_reasons of the one bad request (row 0), server_faults' kinds)
EXCLUDED = {
    "wrong-index": ((), {"server_error:choices[].index": 1}, ()),
    "huge-number": ((), {"server_error:usage.prompt_tokens": 1}, ()),
    "finish-error": ((), {"server_error:finish_reason": 1}, ()),
    "cached-over-prompt": ((), {"server_error:cached_tokens": 1}, ()),
    "nested-event": ((), {"server_error:event": 1}, ()),
    "absurd-metrics": ((), {}, ("server_error:vllm:kv_cache_usage_perc", "server_error:vllm:num_requests_running",
                                "server_error:vllm:num_requests_waiting",
                                "server_error:vllm:prefix_cache_hits_total and vllm:prefix_cache_queries_total")),
    "drip-metrics-later": ((), {}, ("metrics_scrape:timeout",)),
    # the drift probe before the replay meets the hanging /metrics first: the replay does not wait on it again
    "drip-metrics-later+probe": (("--drift-probe",), {}, ("metrics_scrape:given_up",)),
}


@pytest.mark.parametrize("case", sorted(EXCLUDED))
def test_bad_values_are_excluded_and_counted(case, tmp_path, capsys):
    extra, reasons, faults = EXCLUDED[case]
    mode = case.split("+")[0]
    with fault_server(mode) as (url, _):
        code, took = _replay(url, tmp_path, "--json", *extra)
    captured = capsys.readouterr()
    assert code == 0 and "Traceback" not in captured.err, captured.err
    assert took < 2 * TIMEOUT_S, took
    info = json.loads((tmp_path / "r" / "summary.json").read_text())["info"]
    assert info["failed_reasons"] == reasons and info["failed"] == sum(reasons.values())
    assert set(faults) <= set(info["server_faults"]), info["server_faults"]
    for kind in faults:  # each names the server's URL and the value
        assert url in info["server_faults"][kind]["first"]
    failed = [json.loads(line) for line in (tmp_path / "r" / "failed.jsonl").open()]
    assert [(f["row"], f["reason"]) for f in failed] == [(0, r) for r in reasons]
    for f in failed:
        assert f"{url}/v1/completions, trace row 0" in f["error"] and "allowed:" in f["error"]
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())["summary"]
    if mode == "absurd-metrics":  # excluded, not taken as 50x full or as idle
        assert summary["kv_usage_peak"] is None and info["busy_fraction"] is None
        assert summary["prefix_cache_hit_rate"] is None


def test_a_vocab_size_no_vocabulary_has_is_the_servers_fault(tmp_path, capsys):
    with fault_server("huge-vocab") as (url, _):
        code = main(["replay", "--endpoint", url, "--trace", _trace(tmp_path), "--out", str(tmp_path / "r")])
    line = _one_line(capsys, "replay")
    assert code == 2 and f"data[].vocab_size: {10**30} is out of range" in line and f"GET {url}/v1/models" in line


VALIDATE_TIMEOUT_S = 2.0
VALIDATE = {
    "drip": "the drift probe before repeat 1 failed (4 of 4 probe requests failed: POST {url}/v1/completions: no "
            "complete answer within 2 s",
    "drip-reset": "POST {url}/reset_prefix_cache: no complete answer within 2 s",
    "bad-kv-block": "block_size: '16.5' is not an integer",
}


@pytest.mark.parametrize("mode", sorted(VALIDATE))
def test_validate_against_a_faulty_server_is_one_line_within_twice_the_timeout(mode, tmp_path, capsys):
    with fault_server(mode) as (url, _):
        start = time.monotonic()
        code = main(["validate", "--endpoint", url, "--model", "smollm2-135m", "--served-model", "m", "--trace",
                     _trace(tmp_path), "--profile", profile(tmp_path), "--vocab-size", "500", "--timeout",
                     str(VALIDATE_TIMEOUT_S), "--repeats", "1", "--out", str(tmp_path / "v")])
        took = time.monotonic() - start
    line = _one_line(capsys, "validate")
    assert code == 2 and VALIDATE[mode].format(url=url) in line, line
    assert took < 2 * VALIDATE_TIMEOUT_S, took


def test_bench_serve_whose_server_never_comes_up_ends_at_its_timeout(capsys):
    # `--port 1` sends the child elsewhere (or it cannot bind there): /health on the port kvplan chose never answers
    start = time.monotonic()
    code = main(["bench", "serve", "--engine-args", "--port 1", "--timeout", "2"])
    took = time.monotonic() - start
    line = _one_line(capsys, "bench")
    assert code == 2 and took < 2 * 2 + 1, took  # + the child's termination
    assert ("did not answer GET http://127.0.0.1:" in line and "within 2 s of its start" in line) or \
        "exited with status" in line, line
    assert "its last log lines: " in line


def test_a_server_that_exits_during_start_up_is_reported_with_its_last_log_lines(tmp_path):
    log = tmp_path / "serve.log"
    with log.open("wb") as sink:
        child = subprocess.Popen([sys.executable, "-c", "print('loading'); print('error: address in use'); "
                                  "raise SystemExit(3)"], stdout=sink, stderr=subprocess.STDOUT)
    with pytest.raises(ServerStartError, match=r"exited with status 3 during start-up; its last log lines: "
                                                r"loading \| error: address in use"):
        wait_healthy("http://127.0.0.1:9", child, 30.0, log)


def test_strict_json_refuses_nesting_past_its_limit_before_parsing():
    from kvplan.errors import UserError
    from kvplan.strict_json import MAX_DEPTH, loads

    assert loads("[" * MAX_DEPTH + "]" * MAX_DEPTH) is not None
    assert loads('["' + "[{" * 5000 + '"]') == ["[{" * 5000]  # brackets inside a string do not nest
    for text in ("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), '{"a": ' * 100_000, "[" * 1_000_000):
        with pytest.raises(UserError, match=f"nested too deeply; allowed: JSON nested at most {MAX_DEPTH} levels"):
            loads(text)
