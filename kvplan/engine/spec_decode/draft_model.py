"""Drafts from a small model (vLLM's `"method": "draft_model"`): k tokens proposed autoregressively.

The draft model is a plain HF causal LM loaded from `model` (a directory or a built-in name) that must share the
target's vocabulary. It keeps no KV across steps: each proposal runs it over the request's sequence once with
HF's own cache and then k - 1 one-token steps - simple and exact (rejected drafts leave nothing to roll back),
paid for by recomputing the sequence's prefix in every step; the draft model is small, which is the point.
Greedy requests take the draft's argmax; sampled ones draw from the draft's distribution (after the request's
temperature, top-k and top-p) with the request's generator, and return that distribution as `q` for the
rejection sampler.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvplan.engine.models import load_model
from kvplan.engine.sampling import SamplingParams, probabilities
from kvplan.errors import UserError


class DraftModel:
    def __init__(self, name_or_path: str, target_vocab: int, dtype: torch.dtype, device: torch.device) -> None:
        self.loaded = load_model(name_or_path, dtype=dtype, device=str(device))
        self.device = device
        if self.loaded.vocab_size != target_vocab:
            raise UserError(f"speculative_config: key 'model': the draft model has a vocabulary of "
                            f"{self.loaded.vocab_size} tokens, the target model {target_vocab}; allowed: a draft "
                            "model with the target's vocabulary")

    @torch.inference_mode()
    def propose(self, tokens: Sequence[int], k: int, params: SamplingParams,
                generator: torch.Generator) -> tuple[list[int], torch.Tensor | None]:
        """(k drafts, their distributions [k, vocab] for sampled requests or None for greedy ones)."""
        model = self.loaded.model
        ids = torch.tensor([list(tokens)], device=self.device)
        out = model(input_ids=ids, use_cache=True)
        drafts: list[int] = []
        dists: list[torch.Tensor] = []
        for j in range(k):
            logits = out.logits[0, -1].float().cpu()
            if params.greedy:
                token = int(logits.argmax())
            else:
                q = probabilities(logits, params)
                token = int(torch.multinomial(q, 1, generator=generator))
                dists.append(q)
            drafts.append(token)
            if j + 1 < k:
                out = model(input_ids=torch.tensor([[token]], device=self.device), cache=out.cache, use_cache=True)
        return drafts, (torch.stack(dists) if dists else None)
