"""Synthetic request lengths for benchmarks (seeded)."""

from __future__ import annotations

import math

import numpy as np

# vLLM paper (SOSP'23): ShareGPT has mean 161 input / 338 output tokens.
SHAREGPT_MEAN_PROMPT = 161
SHAREGPT_MEAN_OUTPUT = 338


def lognormal_lengths(rng: np.random.Generator, n: int, mean: float, sigma: float, lo: int, hi: int) -> np.ndarray:
    mu = math.log(mean) - sigma * sigma / 2  # so that the untruncated mean is `mean`
    return np.clip(np.rint(rng.lognormal(mu, sigma, n)), lo, hi).astype(np.int64)


def sharegpt_like(n: int, seed: int = 0, max_len: int = 2048) -> list[tuple[int, int]]:
    """(prompt, output) pairs with ShareGPT-like means and a heavy tail, prompt + output <= max_len."""
    rng = np.random.default_rng(seed)
    prompts = lognormal_lengths(rng, n, SHAREGPT_MEAN_PROMPT, 1.0, 1, max_len - 1)
    outputs = lognormal_lengths(rng, n, SHAREGPT_MEAN_OUTPUT, 0.9, 1, max_len)
    outputs = np.minimum(outputs, max_len - prompts)
    return list(zip(prompts.tolist(), outputs.tolist(), strict=True))
