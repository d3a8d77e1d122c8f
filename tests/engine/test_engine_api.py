"""Sampling with n > 1, bad input, the step profiler and the `kvplan generate` CLI."""

from __future__ import annotations

import json

import pytest

from kvplan.engine.llm import LLM
from kvplan.engine.sampling import SamplingParams
from kvplan.cli import main

PROMPT = list(range(40, 60))  # 20 tokens: at block 8, two full blocks and a partial one


def test_n4_shares_the_prompt_blocks_and_each_child_equals_an_independent_run(tiny_models):
    path = tiny_models["tiny-llama"]
    llm = LLM(path, block_size=8, kv_cache_memory=4 << 20, max_model_len=96)
    params = SamplingParams(n=4, temperature=1.0, seed=100, max_tokens=8, ignore_eos=True)
    rid = llm.add_request(PROMPT, params)
    llm.step()  # the prompt is computed once, then forked into 4 sequences
    kv = llm.scheduler.kv
    tables = {sid: ids for sid, ids in kv.block_ids.items() if sid.startswith(rid)}
    assert len(tables) == 4 and len({tuple(t) for t in tables.values()}) == 1
    assert kv.pool.num_used == 3  # 20 prompt tokens in 3 blocks, held once
    outputs = []
    while llm.has_unfinished_requests():
        outputs.extend(llm.step())
    (output,) = outputs
    assert [c.index for c in output.outputs] == [0, 1, 2, 3]
    for completion in output.outputs:
        alone = LLM(path, block_size=8, kv_cache_memory=4 << 20, max_model_len=96).generate(
            [PROMPT], SamplingParams(temperature=1.0, seed=100 + completion.index, max_tokens=8, ignore_eos=True))
        assert completion.token_ids == alone[0].outputs[0].token_ids
    assert len({tuple(c.token_ids) for c in output.outputs}) > 1


def test_top_k_1_is_greedy_and_logprobs_are_returned(tiny_models):
    llm = LLM(tiny_models["tiny-qwen2"], block_size=4, kv_cache_memory=4 << 20, max_model_len=96)
    greedy = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))[0]
    top1 = llm.generate([PROMPT], SamplingParams(temperature=0.8, top_k=1, seed=3, max_tokens=6, ignore_eos=True,
                                                 logprobs=2))[0]
    assert top1.outputs[0].token_ids == greedy.outputs[0].token_ids
    steps = top1.outputs[0].logprobs
    assert len(steps) == 6 and all(len(s.top_logprobs) == 2 and s.logprob <= 0 for s in steps)
    assert all(s.token == max(s.top_logprobs, key=s.top_logprobs.get) for s in steps)


def test_stop_token_ends_a_sequence(tiny_models):
    llm = LLM(tiny_models["tiny-gpt2"], block_size=4, kv_cache_memory=4 << 20, max_model_len=96)
    free = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))[0].outputs[0]
    stop = free.token_ids[2]
    stopped = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True,
                                                    stop_token_ids=(stop,)))[0].outputs[0]
    first = free.token_ids.index(stop)
    assert stopped.token_ids == free.token_ids[:first + 1] and stopped.finish_reason == "stop"


@pytest.mark.parametrize(("prompt", "params", "message"), [
    ([], {}, "empty prompt"),
    (list(range(96)), {}, "longer than the model's context"),
    (list(range(90)), {"max_tokens": 10}, r"exceeds the model's context \(max_model_len 96\)"),
    ([1, 2, 100000], {}, "token ids must lie in"),
])
def test_bad_requests_fail_before_any_work_and_leave_others_running(tiny_models, prompt, params, message):
    llm = LLM(tiny_models["tiny-llama"], block_size=4, kv_cache_memory=4 << 20, max_model_len=96)
    good = llm.add_request(PROMPT, SamplingParams(temperature=0, max_tokens=3))
    with pytest.raises(ValueError, match=message):
        llm.add_request(prompt, SamplingParams(temperature=0, **params))
    with pytest.raises(ValueError, match="prompt 1: "):
        llm.generate([PROMPT, prompt], SamplingParams(temperature=0, **params))
    finished = []
    while llm.has_unfinished_requests():
        finished.extend(llm.step())
    assert [o.request_id for o in finished] == [good]


def test_max_tokens_must_be_positive():
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        SamplingParams(max_tokens=0)


def test_unknown_model_path_and_too_small_kv_budget(tiny_models, tmp_path):
    with pytest.raises(ValueError, match="does-not-exist"):
        LLM(str(tmp_path / "does-not-exist"))
    with pytest.raises(ValueError, match=r"KV budget too small: .*cannot hold one request of max_model_len 96"):
        LLM(tiny_models["tiny-llama"], block_size=4, kv_cache_memory=4096, max_model_len=96)


def test_step_profiler_writes_one_record_per_step(tiny_models, tmp_path):
    path = tmp_path / "profile.jsonl"
    with LLM(tiny_models["tiny-llama"], block_size=4, kv_cache_memory=4 << 20, max_model_len=96,
             max_num_batched_tokens=16, profile_path=path) as llm:
        llm.generate([PROMPT, PROMPT[:7]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
        steps = llm.scheduler.stats.num_steps
        assert not path.exists()  # written to a temporary file until closed
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0]["meta"]["block_size"] == 4 and len(lines) == steps + 1
    first = lines[1]
    assert first["items"] == [["req-0", 16, 0, False, False]]  # [id, new tokens, start, is decode, samples]
    assert set(first["times_s"]) == {"schedule", "prepare", "forward", "sample", "update"}
    assert first["wall_s"] == pytest.approx(sum(first["times_s"].values()))
    assert any(item[3] and item[4] for rec in lines[1:] for item in rec["items"])


def test_generate_cli_prints_tokens_and_metrics(tiny_models, capsys):
    assert main(["generate", "--model", tiny_models["tiny-llama"], "--prompt-ids", "1 2 3 4 5", "--max-tokens", "4",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    (request,) = report["requests"]
    assert len(request["outputs"][0]["token_ids"]) == 4 and request["metrics"]["ttft_s"] > 0
    assert main(["generate", "--model", tiny_models["tiny-llama"], "--prompt", "hello"]) == 2
    assert "no tokenizer" in capsys.readouterr().err


def test_memory_profile_step_runs_the_largest_batch_through_the_model(tiny_models):
    import torch

    from kvplan.engine.attention import register_paged_attention
    from kvplan.engine.backends import make_backend
    from kvplan.engine.kv_cache import KVLayout, PagedKVCache
    from kvplan.engine.memory_profile import dummy_prefill_step
    from kvplan.engine.model_runner import ModelRunner
    from kvplan.engine.models import load_model

    loaded = load_model(tiny_models["tiny-llama"], attn_implementation=register_paged_attention())
    layout = KVLayout(loaded.num_layers, loaded.num_kv_heads, loaded.head_dim, 16, torch.float32)
    step = dummy_prefill_step(100, 16)
    runner = ModelRunner(loaded.model, PagedKVCache(layout, 7, 0, torch.device("cpu")), make_backend(
        "torch", torch.device("cpu")), torch.device("cpu"))
    logits = runner.forward(runner.prepare(step))
    assert step.scheduled[0].block_ids == list(range(7)) and logits.shape == (1, loaded.vocab_size)
