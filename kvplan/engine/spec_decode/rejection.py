"""Verification of drafts by exact rejection sampling (speculative sampling, Leviathan et al. / Chen et al.).

Given the target's logits at the last verified position and at each of the d drafts (d + 1 rows), `verify`
returns the tokens the step emits: the accepted drafts, then one token from the target - so what a request
generates follows the target's distribution whatever the drafts were:

* greedy: the longest prefix of drafts equal to the target's argmax, then the argmax after it;
* sampled: draft x at row j is accepted with probability min(1, p_j(x) / q_j(x)), using the request's own
  generator; the first rejection emits a token from the residual max(0, p_j - q_j) normalised, and if every draft
  is accepted a bonus token is drawn from p_d. `q` is the proposer's distribution: a point mass on the draft for
  n-gram drafts (so acceptance is p_j(x), the residual p_j without x), the draft model's for a draft model.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvplan.engine.sampling import SamplingParams, probabilities


def verify(logits: torch.Tensor, drafts: Sequence[int], params: SamplingParams, generator: torch.Generator,
           q: torch.Tensor | None = None) -> list[int]:
    """The tokens a step verifying `drafts` emits (1 to d + 1 of them); `logits` [d + 1, vocab], `q` the
    proposer's distributions [d, vocab] (None: point masses on the drafts)."""
    if params.greedy:
        target = logits.argmax(dim=-1).tolist()
        out: list[int] = []
        for j, draft in enumerate(drafts):
            if target[j] != draft:
                break
            out.append(draft)
        return [*out, target[len(out)]]
    out = []
    for j, draft in enumerate(drafts):
        p = probabilities(logits[j], params)
        q_x = 1.0 if q is None else float(q[j, draft])
        if q_x > 0 and float(torch.rand((), generator=generator)) < min(1.0, float(p[draft]) / q_x):
            out.append(draft)
            continue
        residual = p.clone()
        if q is None:
            residual[draft] = 0.0
        else:
            residual = torch.clamp(p - q[j].to(p.dtype), min=0.0)
        if float(residual.sum()) <= 0.0:  # p == q up to rounding: any token from p is exact
            residual = p
        out.append(int(torch.multinomial(residual / residual.sum(), 1, generator=generator)))
        return out
    bonus = probabilities(logits[len(drafts)], params)
    return [*out, int(torch.multinomial(bonus, 1, generator=generator))]
