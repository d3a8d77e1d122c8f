"""TRITON_INTERPRET without a GPU; tiny random HF models, built once per session into a temporary directory (never
downloaded)."""

from __future__ import annotations

import pytest
import torch

from tests.triton_env import interpret_without_gpu

interpret_without_gpu()  # before this folder's modules import the engine (and through it kvplan.kernels)

ARCHS = ("tiny-llama", "tiny-qwen2", "tiny-gpt2")


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, str]:
    from kvplan.engine.models import build_random_model

    root = tmp_path_factory.mktemp("models")
    return {arch: str(build_random_model(arch.removeprefix("tiny-"), root / arch, seed=0)) for arch in ARCHS}


@pytest.fixture(scope="session")
def hf_greedy():
    """Reference continuations from HF `generate` (greedy, one prompt at a time, no padding), cached."""
    from transformers import AutoModelForCausalLM

    models: dict[str, torch.nn.Module] = {}
    cache: dict[tuple, list[int]] = {}

    def run(path: str, prompt: list[int], max_new_tokens: int) -> list[int]:
        key = (path, tuple(prompt), max_new_tokens)
        if key not in cache:
            if path not in models:
                models[path] = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
            with torch.inference_mode():
                ids = torch.tensor([prompt])  # an explicit mask: HF would infer one from pad_token_id and hide 0s
                out = models[path].generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                            do_sample=False, min_new_tokens=max_new_tokens, pad_token_id=0)
            cache[key] = out[0, len(prompt):].tolist()
        return cache[key]

    return run
