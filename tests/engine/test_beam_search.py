"""Beam search on copy-on-write blocks: the k sequences and their scores equal HF `generate(num_beams=k)`; beams
share blocks and copy a shared partial block before writing into it; a group split across steps, preempted by
recompute or swapped still decides exactly as HF does; what cannot run is refused up front."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvplan.engine.llm import LLM
from kvplan.engine.sampling import SamplingParams

PROMPTS = [np.random.default_rng(3).integers(1, 400, int(n)).tolist() for n in (5, 11, 17)]
_hf_models: dict[str, torch.nn.Module] = {}


def hf_beams(path: str, prompt: list[int], params: SamplingParams) -> list[tuple[list[int], float]]:
    """HF's k returned sequences (generated part) and sequences_scores."""
    from transformers import AutoModelForCausalLM

    if path not in _hf_models:
        _hf_models[path] = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.tensor([prompt])
    k = params.beam_width
    with torch.inference_mode():
        out = _hf_models[path].generate(
            ids, attention_mask=torch.ones_like(ids), num_beams=k, num_return_sequences=k, do_sample=False,
            max_new_tokens=params.max_tokens, length_penalty=params.length_penalty,
            early_stopping=params.early_stopping, eos_token_id=list(params.stop_token_ids) or None, pad_token_id=0,
            return_dict_in_generate=True, output_scores=True)
    lengths = (out.beam_indices >= 0).sum(1).tolist()  # generated tokens of each returned sequence
    return [(out.sequences[i, len(prompt):len(prompt) + lengths[i]].tolist(), float(out.sequences_scores[i]))
            for i in range(k)]


def assert_equal_to_hf(path: str, outputs, params: SamplingParams, prompts=PROMPTS) -> None:
    for prompt, output in zip(prompts, outputs, strict=True):
        expected = hf_beams(path, prompt, params)
        assert [c.token_ids for c in output.outputs] == [tokens for tokens, _ in expected]
        assert [c.score for c in output.outputs] == pytest.approx([score for _, score in expected], abs=1e-4)


def frequent_tokens(llm: LLM, count: int) -> tuple[int, ...]:
    """Tokens the tiny model's beams actually produce, to serve as EOS so that beams finish early."""
    outputs = llm.beam_search(PROMPTS, 2, 6)
    seen = [t for output in outputs for c in output.outputs for t in c.token_ids[1:4]]
    return tuple(sorted(set(seen), key=seen.index)[:count])


@pytest.mark.parametrize("arch", ["tiny-llama", "tiny-qwen2"])
def test_sequences_and_scores_equal_hf_generate(tiny_models, arch):
    path = tiny_models[arch]
    llm = LLM(path, block_size=4, kv_cache_memory=8 << 20, attention_backend="torch")
    eos = frequent_tokens(llm, 2)
    finished_early = 0
    for k, length_penalty, early_stopping, stops, max_tokens in (
            (2, 1.0, False, (), 10), (4, 1.0, False, eos[:1], 10), (3, 0.5, True, eos, 10),
            (4, 2.0, "never", eos, 10), (3, 1.0, False, eos, 1)):  # one token: the search ends before it forks
        params = SamplingParams(temperature=0, max_tokens=max_tokens, beam_width=k, length_penalty=length_penalty,
                                early_stopping=early_stopping, stop_token_ids=stops)
        outputs = llm.generate(PROMPTS, params)
        assert_equal_to_hf(path, outputs, params)
        finished_early += sum(c.finish_reason == "stop" for o in outputs for c in o.outputs)
        assert all(len(o.outputs) == k for o in outputs)
    assert finished_early > 0  # some hypotheses ended on EOS, not only at the length limit
    assert llm.scheduler.kv.pool.num_used == 0  # every beam's blocks went back


def test_beams_share_blocks_and_copy_a_shared_partial_block_before_writing(tiny_models):
    llm = LLM(tiny_models["tiny-llama"], block_size=4, kv_cache_memory=8 << 20, attention_backend="torch",
              enable_prefix_caching=False)
    llm.add_request(PROMPTS[2], SamplingParams(temperature=0, max_tokens=12, beam_width=4))
    kv, copies, shared_steps = llm.scheduler.kv, 0, 0
    while llm.has_unfinished_requests():
        copies += len(llm.last_step.output.copies) if llm.last_step else 0
        llm.step()
        tables = [kv.tables[r.request_id] for r in llm.scheduler.running]
        distinct = {id(block) for table in tables for block in table}
        if len(tables) > 1:
            assert len(distinct) < sum(len(t) for t in tables)  # the prompt's blocks at least are shared
            shared_steps += 1
        for table in tables:  # a block's reference count is the number of tables holding it
            for block in table:
                assert block.ref_cnt == sum(block in t for t in tables)
    assert shared_steps > 5 and copies > 0
    assert kv.pool.num_used == 0


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_groups_split_across_steps_and_preempted_still_decide_as_hf(tiny_models, mode):
    """24 blocks of 4 tokens hold the largest group with nothing shared, so groups preempt each other, and a
    9-token budget splits a group's beams across model steps: each group must still wait for all its beams."""
    path = tiny_models["tiny-llama"]
    params = SamplingParams(temperature=0, max_tokens=14, beam_width=3)
    prompts = [*PROMPTS, *(np.random.default_rng(5).integers(1, 400, 9).reshape(3, 3).tolist())]
    llm = LLM(path, block_size=4, num_gpu_blocks_override=24, max_model_len=40, preemption_mode=mode,
              max_num_batched_tokens=9,
              attention_backend="torch", enable_prefix_caching=mode == "recompute")
    outputs = llm.generate(prompts, params)
    stats = llm.scheduler.stats
    assert (stats.num_recomputes if mode == "recompute" else stats.num_swap_outs) > 0
    assert_equal_to_hf(path, outputs, params, prompts)
    assert llm.scheduler.kv.pool.num_used == 0


def test_beam_search_refuses_what_it_cannot_run(tiny_models):
    path = tiny_models["tiny-llama"]
    with pytest.raises(ValueError, match="temperature=0"):
        SamplingParams(beam_width=2)
    with pytest.raises(ValueError, match="n must stay 1"):
        SamplingParams(temperature=0, beam_width=2, n=2)
    with pytest.raises(ValueError, match="early_stopping"):
        SamplingParams(temperature=0, beam_width=2, early_stopping="sometimes")
    windowed = LLM(path, block_size=4, kv_cache_memory=4 << 20, sink_tokens=4, window_tokens=16)
    with pytest.raises(ValueError, match="sink\\+window"):
        windowed.beam_search([PROMPTS[0]], 2, 8)
    small = LLM(path, block_size=4, num_gpu_blocks_override=8, max_model_len=32)
    with pytest.raises(ValueError, match="4 beams"):
        small.beam_search([PROMPTS[0]], 4, 8)  # 4 beams of 13 tokens need 16 blocks with nothing shared


def test_generate_cli_prints_every_beam_with_its_score(tiny_models, capsys):
    import json

    from kvplan.cli import main

    ids = " ".join(map(str, PROMPTS[1]))
    assert main(["generate", "--model", tiny_models["tiny-llama"], "--prompt-ids", ids, "--beam-width", "3",
                 "--max-tokens", "6", "--json"]) == 0
    outputs = json.loads(capsys.readouterr().out)["requests"][0]["outputs"]
    scores = [o["score"] for o in outputs]
    assert len(outputs) == 3 and scores == sorted(scores, reverse=True)
    params = SamplingParams(temperature=0, max_tokens=6, beam_width=3)
    assert [o["token_ids"] for o in outputs] == [t for t, _ in hf_beams(tiny_models["tiny-llama"], PROMPTS[1], params)]
    assert main(["generate", "--model", tiny_models["tiny-llama"], "--prompt-ids", ids, "--beam-width", "3",
                 "--temperature", "0.7"]) == 2
    assert "temperature=0" in capsys.readouterr().err
