"""`kvplan serve` on the real small model (SmolLM2-135M-Instruct): chat completions through its chat template with
the official client, stop strings, and a replay whose prompts are text (written with the model's tokenizer)
instead of token ids. Slower tests."""

from __future__ import annotations

import json

import openai
import pandas as pd
import pytest

from kvplan.cli import main
from kvplan.endpoint.local_server import server_process
from kvplan.engine.models import SMOLLM2
from kvplan.traces.io import render
from kvplan.traces.synth import synthesize

pytestmark = pytest.mark.slow  # the server's start on the real model (its first use converts it) is the long part


@pytest.fixture(scope="module")
def smollm2_server():
    with server_process(SMOLLM2, ["--dtype", "float32", "--max-model-len", "1024"], startup_s=300) as url:
        yield url, openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def test_chat_completions_streamed_and_whole_agree(smollm2_server):
    _, client = smollm2_server
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    whole = client.chat.completions.create(model=SMOLLM2, messages=messages, max_tokens=12, temperature=0)
    chunks = list(client.chat.completions.create(model=SMOLLM2, messages=messages, max_tokens=12, temperature=0,
                                                 stream=True))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole.choices[0].message.content
    assert "Paris" in streamed and whole.choices[0].message.role == "assistant"
    assert whole.usage.completion_tokens <= 12 and whole.choices[0].finish_reason in ("stop", "length")


def test_a_stop_string_ends_the_text_before_it(smollm2_server):
    _, client = smollm2_server
    prompt = "One, two, three, four, five,"
    free = client.completions.create(model=SMOLLM2, prompt=prompt, max_tokens=16, temperature=0).choices[0]
    assert " seven" in free.text  # the model counts on
    stopped = client.completions.create(model=SMOLLM2, prompt=prompt, max_tokens=16, temperature=0,
                                        stop=[" seven"]).choices[0]
    assert stopped.finish_reason == "stop" and stopped.text == free.text[:free.text.index(" seven")]
    streamed = list(client.completions.create(model=SMOLLM2, prompt=prompt, max_tokens=16, temperature=0,
                                              stop=[" seven"], stream=True))
    assert "".join(c.choices[0].text for c in streamed) == stopped.text
    assert streamed[-1].choices[0].finish_reason == "stop"


def test_a_replay_with_text_prompts_keeps_the_trace_lengths(smollm2_server, tmp_path, capsys):
    url, _ = smollm2_server
    spec = {"seed": 1, "requests": 8, "arrivals": {"process": "poisson", "rate": 8},
            "lengths": {"prompt": {"dist": "uniform", "min": 20, "max": 120},
                        "output": {"dist": "uniform", "min": 2, "max": 6}},
            "prefix": {"granularity": 16, "system_prompts": {"count": 2, "tokens": {"dist": "uniform", "min": 32,
                                                                                     "max": 48}, "zipf": 1.0}}}
    trace = synthesize(spec)
    path = tmp_path / "trace.jsonl"
    path.write_bytes(render(trace, "jsonl"))
    out = tmp_path / "replay"
    assert main(["replay", "--endpoint", url, "--model", SMOLLM2, "--tokenizer", SMOLLM2, "--trace", str(path),
                 "--out", str(out)]) == 0
    assert "8 completed, 0 failed" in capsys.readouterr().out
    table = pd.read_parquet(out / "requests.parquet")
    # the server's own count of each text prompt's tokens is the trace's length: word tokens re-encode exactly
    assert (table["prompt_tokens"].to_numpy() == trace.prompt_tokens).all()
    assert (table["output_tokens"].to_numpy() == trace.output_tokens).all()
    assert json.loads((out / "endpoint.json").read_text())["prompts"] == "text"
    summary = json.loads((out / "summary.json").read_text())["summary"]
    assert summary["prefix_cache_hits"] > 0  # the shared system prompts stay shared as text
