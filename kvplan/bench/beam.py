"""`kvplan bench beam`: the memory that copy-on-write block sharing saves in beam search and parallel sampling.

Workload (the shape of the vLLM paper's Alpaca runs, section 6.3): `--requests` prompts cut from a real text at
lengths `rng.integers(12, 27)` (mean ~19) tokens, each asked for `rng.integers(40, 77)` (mean ~58) output tokens,
EOS ignored so every request runs its full length; `rng = numpy.random.default_rng(seed)`. All requests run
together in one engine, for beam widths 2, 4, 6 and, as the paper's other case, parallel sampling with n = 2, 4, 6.

After every step the engine's block tables are read: blocks held (a shared block once) against blocks the same
sequences would hold with nothing shared (every table entry) - the baseline, measured in the same run. Saving =
1 - held / independent, per step and overall (the sums over all steps: time-averaged memory).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

WIDTHS = (2, 4, 6)
DEFAULT_TEXT = Path("/usr/share/common-licenses/GPL-3")


def workload(tokens: list[int], requests: int, seed: int) -> tuple[list[list[int]], list[int]]:
    rng = np.random.default_rng(seed)
    prompt_lens = rng.integers(12, 27, requests)
    output_lens = rng.integers(40, 77, requests)
    starts = rng.integers(0, len(tokens) - int(prompt_lens.max()), requests)
    prompts = [tokens[int(s):int(s) + int(n)] for s, n in zip(starts, prompt_lens, strict=True)]
    return prompts, [int(n) for n in output_lens]


def measure(llm, prompts: list[list[int]], params: list) -> dict:
    """Run the requests together; the sharing after every step and overall."""
    from kvplan.engine.core import block_sharing

    for prompt, p in zip(prompts, params, strict=True):
        llm.add_request(prompt, p)
    per_step, held_total, independent_total, copies = [], 0, 0, 0
    start = time.perf_counter()
    while llm.has_unfinished_requests():
        llm.step()
        copies += len(llm.last_step.output.copies)
        held, independent = block_sharing(llm.scheduler.kv, llm.scheduler.running)
        if independent:
            per_step.append(round(1 - held / independent, 4))
            held_total += held
            independent_total += independent
    return {"memory_saving": 1 - held_total / independent_total, "saving_per_step": per_step,
            "min_step_saving": min(per_step), "max_step_saving": max(per_step),
            "blocks_held": held_total, "blocks_independent": independent_total, "copy_on_write_copies": copies,
            "steps": len(per_step), "seconds": time.perf_counter() - start}


def run(model: str, text: Path, requests: int, seed: int, block_size: int = 16) -> dict:
    from kvplan.engine.llm import LLM
    from kvplan.engine.models import load_tokenizer, resolve_model
    from kvplan.engine.sampling import SamplingParams

    path = str(resolve_model(model))
    tokenizer, content = load_tokenizer(path), text.read_text(encoding="utf-8")
    # a model without a tokenizer (the tiny random ones) reads the text's UTF-8 bytes as token ids
    tokens = tokenizer.encode(content) if tokenizer is not None else list(content.encode())
    if len(tokens) < 64:
        raise ValueError(f"--text: {text}: {len(tokens)} tokens; allowed: a text of at least 64 tokens")
    prompts, outputs = workload(tokens, requests, seed)
    results: dict[str, dict] = {}
    for width in WIDTHS:
        for kind in ("beam_search", "parallel_sampling"):
            llm = LLM(path, block_size=block_size, kv_cache_memory=1 << 30, max_num_seqs=requests * width,
                      enable_prefix_caching=False, seed=seed)
            params = [SamplingParams(temperature=0, max_tokens=n, beam_width=width, ignore_eos=True)
                      if kind == "beam_search" else SamplingParams(n=width, max_tokens=n, ignore_eos=True)
                      for n in outputs]
            results[f"{kind}_{width}"] = {"kind": kind, "width": width, **measure(llm, prompts, params)}
    return {"model": model, "block_size": block_size, "requests": requests, "seed": seed, "text": str(text),
            "mean_prompt_tokens": float(np.mean([len(p) for p in prompts])),
            "mean_output_tokens": float(np.mean(outputs)), "results": results}
