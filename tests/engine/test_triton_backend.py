"""The Triton backend (under TRITON_INTERPRET=1 on CPU) gives exactly the torch backend's greedy tokens."""

from __future__ import annotations

import pytest

from engine.llm import LLM
from engine.sampling import SamplingParams

PROMPTS = [[5, 9, 13, 2, 7, 7, 1, 30, 22, 11, 4], [5, 9, 13, 2, 7, 7, 1, 30, 40], [100, 3]]


def greedy(llm: LLM) -> tuple[list[list[int]], bool]:
    """Greedy continuations, and whether sink+window ever left a hole in a block table."""
    ids = [llm.add_request(p, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)) for p in PROMPTS]
    done, saw_hole = {}, False
    while llm.has_unfinished_requests():
        done.update({o.request_id: o.outputs[0].token_ids for o in llm.step()})
        saw_hole |= any(-1 in table for table in llm.scheduler.kv.block_ids.values())
    return [done[i] for i in ids], saw_hole


@pytest.mark.parametrize("window", [{}, {"sink_tokens": 2, "window_tokens": 8}], ids=["full", "sink_window"])
def test_triton_backend_matches_torch_backend(tiny_models, window):
    results = {}
    for backend in ("torch", "triton"):
        llm = LLM(tiny_models["tiny-llama"], block_size=4, kv_cache_memory=1 << 20, max_model_len=64,
                  max_num_batched_tokens=8, attention_backend=backend, **window)
        results[backend] = greedy(llm)
    assert results["triton"] == results["torch"]
    assert results["torch"][1] == bool(window)  # the window case really released blocks mid-request


def test_triton_backend_refuses_cpu_without_the_interpreter(tiny_models, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="needs a CUDA device"):
        LLM(tiny_models["tiny-llama"], block_size=4, kv_cache_memory=1 << 20, attention_backend="triton")
