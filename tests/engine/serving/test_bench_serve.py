"""`kvplan bench serve` on tiny-llama, briefly: the ramp, the hold and the leak checks run and agree."""

from __future__ import annotations

import json
import shlex

import pytest

from kvplan.cli import main
from tests.engine.serving.servers import TINY


@pytest.mark.slow
def test_bench_serve_ramps_holds_and_finds_no_leak(tiny_models, capsys):
    assert main(["bench", "serve", "--model", tiny_models["tiny-llama"], "--hold", "1", "--ramp", "0.5",
                 "--max-concurrency", "4", "--prompt-tokens", "40", "--output-tokens", "8",
                 "--engine-args", shlex.join(TINY), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["ok"] and result["failed"] == 0 and result["leaked_blocks"] == 0
    assert [r["concurrency"] for r in result["ramp"]][:2] == [1, 2]
    assert result["saturation_concurrency"] in {r["concurrency"] for r in result["ramp"]}
    assert result["requests_counted_by_server"] == result["requests_sent"] == sum(
        r["requests"] for r in result["ramp"]) + result["hold"]["requests"]
    assert result["num_kv_blocks"] == 64 and result["hold"]["p99_ttft_ms"] > 0
