"""The LoRA options on the engine commands: each misuse refused in one line naming the flag, before any model
loads (an adapter's own problems - rank, target modules, shapes - are tests/engine/test_lora.py's)."""

from __future__ import annotations

import pytest

from tests.badinput.contract import refused

GENERATE = ["generate", "--model", "tiny-llama", "--prompt-ids", "1 2"]
SERVE = ["serve", "--model", "tiny-llama", "--port", "1"]


@pytest.mark.parametrize(("argv", "where"), [
    ([*GENERATE, "--lora-modules", "sql=/nowhere"], "argument --lora-modules: needs LoRA on"),
    ([*SERVE, "--lora-modules", "sql=/nowhere"], "argument --lora-modules: needs LoRA on"),
    ([*GENERATE, "--max-loras", "2"], "argument --max-loras: needs LoRA adapters"),
    ([*SERVE, "--max-cpu-loras", "4"], "argument --max-cpu-loras: needs LoRA adapters"),
    ([*GENERATE, "--enable-lora", "--max-lora-rank", "12"], "argument --max-lora-rank: 12 is not a rank"),
    ([*SERVE, "--enable-lora", "--max-loras", "3", "--max-cpu-loras", "2"],
     "argument --max-cpu-loras: 2 is below max_loras 3"),
    ([*GENERATE, "--enable-lora", "--lora-modules", "sql"], "argument --lora-modules: 'sql' is not name=path"),
    ([*GENERATE, "--enable-lora", "--lora-modules", "a=/x", "a=/y"], "adapter name 'a' is given twice"),
    ([*GENERATE, "--enable-lora", "--lora-modules", "sql=/x", "--lora", "chat"],
     "argument --lora: 'chat' is not an adapter of --lora-modules; allowed: sql"),
    ([*GENERATE, "--lora", "chat"], "argument --lora: 'chat'"),
    ([*GENERATE, "--enable-lora", "--max-loras", "0"], "--max-loras"),
])
def test_lora_options_are_refused_in_one_line(capsys, argv, where):
    refused(capsys, argv, where)
