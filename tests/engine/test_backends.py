"""The fused CPU backend and the Triton backend (under TRITON_INTERPRET=1 on CPU) give exactly the torch
backend's greedy tokens; the fused CPU decode kernel equals the torch reference."""

from __future__ import annotations

import pytest
import torch

from kvplan.engine.backends.cpu_backend import cpu_kernel_error, paged_decode
from kvplan.engine.llm import LLM
from kvplan.engine.sampling import SamplingParams

needs_cpu_kernel = pytest.mark.skipif(cpu_kernel_error() is not None,
                                      reason=f"fused CPU kernel cannot be built here: {cpu_kernel_error()}")

PROMPTS = [[5, 9, 13, 2, 7, 7, 1, 30, 22, 11, 4], [5, 9, 13, 2, 7, 7, 1, 30, 40], [100, 3]]


def greedy(llm: LLM) -> tuple[list[list[int]], bool]:
    """Greedy continuations, and whether sink+window ever left a hole in a block table."""
    ids = [llm.add_request(p, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)) for p in PROMPTS]
    done, saw_hole = {}, False
    while llm.has_unfinished_requests():
        done.update({o.request_id: o.outputs[0].token_ids for o in llm.step()})
        saw_hole |= any(-1 in table for table in llm.scheduler.kv.block_ids.values())
    return [done[i] for i in ids], saw_hole


@pytest.mark.parametrize("backend", [pytest.param("cpu", marks=needs_cpu_kernel),
                                     pytest.param("triton", marks=pytest.mark.slow)])  # the interpreter: 2.7-4.2 s
@pytest.mark.parametrize("window", [{}, {"sink_tokens": 2, "window_tokens": 8}], ids=["full", "sink_window"])
def test_backend_matches_torch_backend(tiny_models, backend, window):
    results = {}
    for name in ("torch", backend):
        llm = LLM(tiny_models["tiny-llama"], dtype="float32", block_size=4, kv_cache_memory=1 << 20, max_model_len=64,
                  max_num_batched_tokens=8, attention_backend=name, **window)
        results[name] = greedy(llm)
    assert results[backend] == results["torch"]
    assert results["torch"][1] == bool(window)  # the window case really released blocks mid-request


@pytest.mark.parametrize("backend", [pytest.param("cpu", marks=needs_cpu_kernel),
                                     pytest.param("triton", marks=pytest.mark.slow)])  # the interpreter: 2.7-4.2 s
@pytest.mark.parametrize("kv", ["int8", "fp8_e4m3"])
def test_quantized_caches_give_the_torch_backends_tokens(tiny_models, backend, kv):
    """The Triton kernels quantize on store and dequantize in attention with the scheme the torch backend
    applies in Python; the CPU backend decodes a quantized cache through the torch path."""
    results = {}
    for name in ("torch", backend):
        llm = LLM(tiny_models["tiny-llama"], dtype="float32", block_size=4, kv_cache_memory=1 << 20,
                  max_model_len=64, max_num_batched_tokens=8, attention_backend=name, kv_cache_dtype=kv)
        results[name] = greedy(llm)
    assert results[backend] == results["torch"]


@needs_cpu_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("block_size,kv_heads,group", [(1, 1, 4), (8, 2, 3), (16, 4, 1), (32, 2, 2)])
@pytest.mark.parametrize("sinks,window", [(0, 0), (2, 9), (0, 5)])
def test_fused_cpu_decode_equals_the_reference(dtype, block_size, kv_heads, group, sinks, window):
    from kvplan.kernels.reference import ref_paged_decode_attention

    gen = torch.Generator().manual_seed(block_size * 31 + kv_heads)
    num_blocks, dim, width = 80, 16, 70 // block_size + 1
    k_cache = torch.randn(num_blocks, block_size, kv_heads, dim, generator=gen).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, dim, generator=gen).to(dtype)
    lens = torch.tensor([1, block_size, block_size + 1, 70], dtype=torch.int32)  # ragged, at block boundaries
    tables = torch.stack([torch.randperm(num_blocks, generator=gen)[:width] for _ in lens]).int()
    if window:  # sink+window releases the blocks between the sinks and the window: -1 holes are never read
        first, last = -(-sinks // block_size), (70 - window) // block_size
        tables[3, first:last] = -1
    query = torch.randn(len(lens), kv_heads * group, dim, generator=gen)
    out = paged_decode(query, k_cache, v_cache, tables, lens, dim ** -0.5, sinks, window)
    ref = ref_paged_decode_attention(query, k_cache.float(), v_cache.float(), tables.clamp(min=0), lens,
                                     dim ** -0.5, sinks, window)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)


def test_triton_backend_refuses_cpu_without_the_interpreter(tiny_models, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="needs a CUDA device"):
        LLM(tiny_models["tiny-llama"], dtype="float32", block_size=4, kv_cache_memory=1 << 20,
            attention_backend="triton")


def test_cpu_default_falls_back_to_torch_when_the_kernel_cannot_be_built(monkeypatch, caplog):
    import kvplan.engine.backends.cpu_backend as cpu_backend
    from kvplan.engine.backends import default_backend

    if cpu_backend.cpu_kernel_error() is None:
        assert default_backend(torch.device("cpu")) == "cpu"
    monkeypatch.setattr(cpu_backend, "cpu_kernel_error", lambda: "CalledProcessError: no compiler")
    assert default_backend(torch.device("cpu")) == "torch"
    assert "no compiler" in caplog.text
    with pytest.raises(RuntimeError, match="no compiler"):
        cpu_backend.CpuAttentionBackend()
