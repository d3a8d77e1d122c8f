"""`kvplan bench engine`: the live engine against HF `generate` (static batches) and HF's own continuous batching,
on the mixed workload of the engine issue, all in one run.

Workload: 64 requests, `rng = numpy.random.default_rng(0)`, prompt lengths `rng.integers(32, 513, 64)`, then
output lengths `rng.integers(16, 257, 64)`, then random prompt token ids; every request generates exactly its
output length (EOS ignored). Useful tokens are the requested output tokens; a static batch that runs to its
longest member produces more, but only the requested ones count.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

MODEL = "llama-100m"


@dataclass(slots=True)
class Workload:
    prompts: list[list[int]]
    outputs: list[int]

    @property
    def useful_tokens(self) -> int:
        return sum(self.outputs)


def mixed_workload(num_requests: int = 64, vocab: int = 32000, seed: int = 0) -> Workload:
    rng = np.random.default_rng(seed)
    prompt_lens = rng.integers(32, 513, num_requests)
    output_lens = rng.integers(16, 257, num_requests)
    prompts = [rng.integers(0, vocab, int(n)).tolist() for n in prompt_lens]
    return Workload(prompts, [int(n) for n in output_lens])


def run_engine(path: str, work: Workload, dtype: torch.dtype, block_size: int = 16) -> dict:
    from kvplan.engine.core import memory_breakdown
    from kvplan.engine.llm import LLM
    from kvplan.engine.sampling import SamplingParams

    llm = LLM(path, block_size=block_size, dtype=dtype, kv_cache_memory=1 << 30, max_num_seqs=64,
              max_num_batched_tokens=2048, enable_prefix_caching=False)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in work.outputs]
    utilization: list[float] = []
    start = time.perf_counter()
    ids = [llm.add_request(p, sp) for p, sp in zip(work.prompts, params, strict=True)]
    done: dict[str, list[int]] = {}
    while llm.has_unfinished_requests():
        for output in llm.step():
            done[output.request_id] = output.outputs[0].token_ids
        live = [*llm.scheduler.running]
        if live and llm.scheduler.step_id % 8 == 0:  # sampled: the breakdown walks every block table
            utilization.append(memory_breakdown(llm.scheduler.kv, live).kv_token_utilization)
    seconds = time.perf_counter() - start
    generated = sum(len(done[i]) for i in ids)
    if generated != work.useful_tokens:
        raise RuntimeError(f"engine produced {generated} tokens, expected {work.useful_tokens}")
    return {"seconds": seconds, "useful_tokens_per_s": work.useful_tokens / seconds,
            "kv_token_utilization": float(np.mean(utilization)), "steps": llm.scheduler.stats.num_steps}


def run_hf_static(model: torch.nn.Module, work: Workload, batch_size: int) -> dict:
    start = time.perf_counter()
    generated = 0
    for first in range(0, len(work.prompts), batch_size):
        prompts = work.prompts[first:first + batch_size]
        longest_out = max(work.outputs[first:first + batch_size])
        width = max(len(p) for p in prompts)
        ids = torch.zeros((len(prompts), width), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, prompt in enumerate(prompts):  # left padding, as decoder-only batching needs
            ids[row, width - len(prompt):] = torch.tensor(prompt)
            mask[row, width - len(prompt):] = 1
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=longest_out,
                                 min_new_tokens=longest_out, do_sample=False, pad_token_id=0)
        generated += (out.shape[1] - width) * len(prompts)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "useful_tokens_per_s": work.useful_tokens / seconds,
            "generated_tokens": generated, "useful_fraction": work.useful_tokens / generated}


def run_hf_continuous(model: torch.nn.Module, work: Workload) -> dict:
    """HF's own continuous batching (the manager behind `generate_batch`), with each request's own length."""
    from transformers import GenerationConfig

    config = GenerationConfig(do_sample=False, max_new_tokens=max(work.outputs), eos_token_id=-1, pad_token_id=0)
    start = time.perf_counter()
    results = {}
    with model.continuous_batching_context_manager(generation_config=config, block=True, timeout=30) as manager:
        ids = [manager.add_request(p, max_new_tokens=n, eos_token_id=-1)
               for p, n in zip(work.prompts, work.outputs, strict=True)]
        while len(results) < len(ids):
            result = manager.get_result(timeout=5)
            if result is not None and result.is_finished():
                results[result.request_id] = result
            elif result is None and not manager.is_running():
                raise RuntimeError("HF continuous batching stopped before finishing the workload")
    seconds = time.perf_counter() - start
    generated = sum(len(r.generated_tokens) for r in results.values())
    return {"seconds": seconds, "useful_tokens_per_s": work.useful_tokens / seconds, "generated_tokens": generated}


def run(dtype_name: str = "bfloat16", num_requests: int = 64) -> dict:
    from transformers import AutoModelForCausalLM

    from kvplan.engine.models import resolve_model

    torch.manual_seed(0)
    dtype = getattr(torch, dtype_name)
    path = str(resolve_model(MODEL))
    work = mixed_workload(num_requests)
    results = {"engine": run_engine(path, work, dtype)}
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    for batch in (8, 16):
        results[f"hf_generate_static_{batch}"] = run_hf_static(hf, work, batch)
    hf_cb = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa").eval()
    results["hf_generate_batch"] = run_hf_continuous(hf_cb, work)
    engine_tps = results["engine"]["useful_tokens_per_s"]
    best_static = max(results[f"hf_generate_static_{b}"]["useful_tokens_per_s"] for b in (8, 16))
    return {
        "model": MODEL, "dtype": dtype_name, "requests": num_requests, "useful_tokens": work.useful_tokens,
        "results": results,
        "ratio_vs_best_static": engine_tps / best_static,
        "ratio_vs_generate_batch": engine_tps / results["hf_generate_batch"]["useful_tokens_per_s"],
        "threads": torch.get_num_threads(),
    }
