"""Speculative decoding and LoRA on the simulator's side: every misuse refused in one line naming the flag or the
YAML key and what is allowed, exit 2 (the live engine's own refusals are tests/engine/test_spec_decode.py's and
tests/badinput/test_lora_options.py's)."""

from __future__ import annotations

import pytest

from tests.badinput.contract import refused

SIMULATE = ["simulate", "--trace", "traces/samples/chat.jsonl", "--rate", "5", "--model", "llama-3-8b"]


@pytest.mark.parametrize(("argv", "where"), [
    ([*SIMULATE, "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 0}'],
     "num_speculative_tokens"),
    ([*SIMULATE, "--speculative-config", '{"method": "medusa", "num_speculative_tokens": 2}'], "method"),
    ([*SIMULATE, "--speculative-config", "not json"], "--speculative-config"),
    ([*SIMULATE, "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2}'],
     "speculative_config: the simulator needs to know how often drafts are accepted"),
    ([*SIMULATE, "--speculative-config",
      '{"method": "ngram", "num_speculative_tokens": 2, "acceptance": [0.5, 0.6, 0]}'], "acceptance"),
    ([*SIMULATE, "--speculative-config", '{"method": "draft_model", "model": "no-such-model", '
                                          '"num_speculative_tokens": 2, "acceptance_rate": 0.5}'], "no-such-model"),
    ([*SIMULATE, "--max-num-batched-tokens", "1", "--max-model-len", "8192", "--speculative-config",
      '{"method": "draft_model", "model": "llama-3.2-1b", "num_speculative_tokens": 2, "acceptance_rate": 0.5}'],
     "max_num_batched_tokens: 1 leaves no token once a request takes its 1 drafting row"),
    ([*SIMULATE, "--lora-adapters", "4"], "names LoRA adapter"),
    ([*SIMULATE, "--max-loras", "4"], "argument --max-loras: needs LoRA adapters"),
    ([*SIMULATE, "--enable-lora", "--max-lora-rank", "12"], "argument --max-lora-rank: 12 is not a rank vLLM serves"),
    ([*SIMULATE, "--enable-lora", "--max-loras", "4", "--max-cpu-loras", "2"], "max_cpu_loras: 2 is below max_loras 4"),
    ([*SIMULATE, "--enable-lora", "--lora-adapters", "0"], "--lora-adapters"),
    ([*SIMULATE, "--enable-lora", "--lora-adapters", "4", "--lora-skew", "-1"], "--lora-skew"),
    (["simulate", "--trace", "traces/samples/chat.jsonl", "--model", "mixtral-8x7b", "--enable-lora",
      "--lora-adapters", "2"], "allowed: a dense model"),
])
def test_simulate_refuses_in_one_line(capsys, argv, where):
    refused(capsys, argv, where)
