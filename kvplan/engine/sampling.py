"""Sampling parameters and the sampler.

Every random draw uses the request's own `torch.Generator`, seeded from `SamplingParams.seed` (or from the
engine's seeded generator when no seed is given), so a request's tokens do not depend on what else is in the
batch. For n > 1 the j-th sequence draws from seed + j: each sequence equals an independent n = 1 run with that
seed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kvplan.errors import UserError


@dataclass(slots=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0  # 0 = greedy
    top_k: int = 0  # 0 = no limit
    top_p: float = 1.0
    max_tokens: int = 16
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # also return this many top alternatives per token
    # beam search (HF generate(num_beams=...) semantics): 0 = off; k >= 1 keeps k beams and returns k sequences
    beam_width: int = 0
    length_penalty: float = 1.0  # a finished beam scores cumulative logprob / generated length ** length_penalty
    early_stopping: bool | str = False  # True: stop once k beams finished; False: heuristic; "never": exhaustive

    def __post_init__(self) -> None:
        beam = self.beam_width > 0
        checks = ((self.n >= 1, "n must be >= 1"), (self.temperature >= 0, "temperature must be >= 0"),
                  (self.top_k >= 0, "top_k must be >= 0 (0 = off)"), (0 < self.top_p <= 1, "top_p must be in (0, 1]"),
                  (self.max_tokens >= 1, "max_tokens must be >= 1"),
                  (self.logprobs is None or self.logprobs >= 0, "logprobs must be >= 0"),
                  (self.beam_width >= 0, "beam_width must be >= 0 (0 = no beam search)"),
                  (self.early_stopping in (True, False, "never"), "early_stopping must be True, False or 'never'"),
                  (not beam or (self.temperature == 0 and self.top_k == 0 and self.top_p == 1.0),
                   "beam search is deterministic: it needs temperature=0 and no top_k / top_p"),
                  (not beam or self.n == 1, "beam search returns beam_width sequences: n must stay 1"),
                  (not beam or self.logprobs is None, "logprobs are not reported for beam search"))
        for ok, message in checks:
            if not ok:
                raise UserError(f"SamplingParams: {message}, got {self!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(slots=True)
class SampledToken:
    token: int
    logprob: float | None = None
    top_logprobs: dict[int, float] = field(default_factory=dict)


def sample_row(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> SampledToken:
    """One token from a [vocab] logits row."""
    logits = logits.float()
    if params.greedy:
        token = int(torch.argmax(logits))
    else:
        token = int(torch.multinomial(probabilities(logits, params), 1, generator=generator))
    if params.logprobs is None:
        return SampledToken(token)
    logprobs = torch.log_softmax(logits, dim=-1)
    top = torch.topk(logprobs, params.logprobs) if params.logprobs else None
    alternatives = {} if top is None else dict(zip(top.indices.tolist(), top.values.tolist(), strict=True))
    return SampledToken(token, float(logprobs[token]), alternatives)


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution a sampled (temperature > 0) request draws from, after temperature, top-k and top-p:
    the sampler's and the speculative verifier's one definition."""
    return torch.softmax(_filter(logits.float() / params.temperature, params.top_k, params.top_p), dim=-1)


def _filter(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
        drop = cumulative - torch.softmax(sorted_logits, dim=-1) >= top_p  # keep the smallest prefix reaching top_p
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    return logits
