"""Speculative decoding in the simulator: how many drafts a request proposes and how many the target accepts.

The scheduler (engine.core) schedules a request's drafts with its next token and rolls back the rejected ones, as
vLLM does; the live engine learns the outcome by running the target, the simulator draws it from an
`AcceptanceModel`:

* `acceptance_rate: a` in the speculative config: each draft position is accepted with probability a given that
  the positions before it were (the standard independence assumption of the speculative-sampling papers);
* `acceptance: [p0, ..., pk]`: the probability that exactly j of the k drafts are accepted;
* measured: a calibrated profile's `speculative` section, written by `kvplan calibrate --speculative-config`
  from the live engine's own verification steps on a corpus (the drafts each step proposed and the target
  accepted, so an n-gram proposer's steps without a match count too).

A measured model taken at K drafts serves any k: its per-position conditional acceptance rates are kept (a
position beyond K takes the K-th rate), and the share of steps that proposed nothing is kept as such.

Each draw goes through the simulation's seeded generator, one draw per proposal, in the order the replica makes
the proposals, so a run is reproducible. The invariant: 0 <= accepted <= drafts <= k.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from kvplan.errors import UserError

PROB_TOLERANCE = 1e-6


@dataclass(frozen=True, slots=True)
class AcceptanceModel:
    """The outcome of one proposal: `drafts` proposed (0 when the proposer found nothing) and `accepted`.

    `no_draft` is the probability that a proposal is empty; `position_rates[j]` the probability that draft j + 1
    is accepted given drafts 1..j were. `source` says where it came from (shown in the run's info)."""

    k: int
    position_rates: tuple[float, ...]
    no_draft: float = 0.0
    source: str = ""

    def __post_init__(self) -> None:
        if len(self.position_rates) != self.k:
            raise ValueError(f"{self.k} drafts need {self.k} position rates, got {len(self.position_rates)}")

    @property
    def accepted_distribution(self) -> tuple[float, ...]:
        """P(exactly j drafts accepted | k proposed), j = 0..k."""
        out, reached = [], 1.0
        for rate in self.position_rates:
            out.append(reached * (1.0 - rate))
            reached *= rate
        return (*out, reached)

    @property
    def mean_accepted(self) -> float:
        """Expected drafts accepted per proposal (empty proposals included)."""
        expected = sum(j * p for j, p in enumerate(self.accepted_distribution))
        return (1.0 - self.no_draft) * expected

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafts / proposed drafts (vLLM's spec-decode acceptance rate)."""
        proposed = (1.0 - self.no_draft) * self.k
        return self.mean_accepted / proposed if proposed else 0.0

    def sampler(self, rng: np.random.Generator) -> DraftSampler:
        return DraftSampler(self, rng)

    def describe(self) -> str:
        return (f"k={self.k}, acceptance rate {self.acceptance_rate:.3f}, {1 + self.mean_accepted:.2f} tokens per "
                f"verification step ({self.source})")


class DraftSampler:
    """Draws (drafts, accepted) per proposal from an `AcceptanceModel`, in blocks of uniform variates from the
    run's generator (one variate per proposal: the same stream whatever the batch)."""

    __slots__ = ("_buffer", "_cumulative", "_next", "_rng", "k", "no_draft")

    def __init__(self, model: AcceptanceModel, rng: np.random.Generator) -> None:
        self.k, self.no_draft = model.k, model.no_draft
        self._cumulative = np.cumsum(model.accepted_distribution[:-1]).tolist()
        self._rng = rng
        self._buffer: list[float] = []
        self._next = 0

    def draw(self) -> tuple[int, int]:
        if self._next == len(self._buffer):
            self._buffer, self._next = self._rng.random(4096).tolist(), 0
        u = self._buffer[self._next]
        self._next += 1
        if u < self.no_draft:
            return 0, 0
        u = (u - self.no_draft) / (1.0 - self.no_draft)
        for j, bound in enumerate(self._cumulative):
            if u < bound:
                return self.k, j
        return self.k, self.k


def _number(value: object, what: str, low: float, high: float, low_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or value < low or value > high or (low_open and value == low):
        bound = f"> {low:g}" if low_open else f">= {low:g}"
        raise UserError(f"{what}: {value!r}; allowed: a number {bound} and <= {high:g}")
    return float(value)


def from_rate(k: int, rate: float, what: str = "speculative_config.acceptance_rate") -> AcceptanceModel:
    rate = _number(rate, what, 0.0, 1.0)
    return AcceptanceModel(k, (rate,) * k, 0.0, f"acceptance_rate {rate:g}")


def from_distribution(k: int, probabilities: Sequence[float],
                      what: str = "speculative_config.acceptance") -> AcceptanceModel:
    """The model whose accepted count is distributed as `probabilities` (j = 0..k)."""
    if isinstance(probabilities, str) or not isinstance(probabilities, Sequence) or len(probabilities) != k + 1:
        raise UserError(f"{what}: {probabilities!r}; allowed: a list of {k + 1} probabilities (accepting 0..{k} of "
                        f"the {k} drafts) that sum to 1")
    p = [_number(x, f"{what}[{j}]", 0.0, 1.0) for j, x in enumerate(probabilities)]
    if abs(sum(p) - 1.0) > PROB_TOLERANCE:
        raise UserError(f"{what}: sums to {sum(p):.6g}; allowed: probabilities that sum to 1")
    rates, tail = [], 1.0
    for j in range(k):
        beyond = tail - p[j]  # P(accepted > j)
        rates.append(min(max(beyond / tail, 0.0), 1.0) if tail > 0 else 0.0)
        tail = beyond
    return AcceptanceModel(k, tuple(rates), 0.0, f"acceptance {list(probabilities)}")


def from_counts(k: int, counts: Mapping[tuple[int, int], int], source: str) -> AcceptanceModel:
    """The model of measured proposals: counts[(drafts, accepted)] over a run's verification steps (drafts 0: a
    proposal that found nothing). Positions beyond the longest measured proposal take its last rate."""
    total = sum(counts.values())
    if total == 0:
        raise UserError(f"{source}: no verification step was measured; allowed: a corpus whose prompts produce "
                        "draft proposals")
    empty = sum(n for (d, _), n in counts.items() if d == 0)
    longest = max((d for d, _ in counts), default=0)
    rates: list[float] = []
    for j in range(1, longest + 1):
        reached = sum(n for (d, a), n in counts.items() if d >= j and a >= j - 1)
        accepted = sum(n for (d, a), n in counts.items() if d >= j and a >= j)
        rates.append(accepted / reached if reached else (rates[-1] if rates else 0.0))
    if not rates:
        rates = [0.0]
    rates = (rates + [rates[-1]] * k)[:k]
    return AcceptanceModel(k, tuple(rates), empty / total, source)


def counts_from_records(records: Sequence[Sequence[int]]) -> dict[tuple[int, int], int]:
    """[(drafts, accepted, count), ...] as a profile stores them -> {(drafts, accepted): count}."""
    out: dict[tuple[int, int], int] = {}
    for drafts, accepted, count in records:
        out[(int(drafts), int(accepted))] = out.get((int(drafts), int(accepted)), 0) + int(count)
    return out


def acceptance_model(k: int, rate: float | None, distribution: Sequence[float] | None,
                     measured: Mapping[str, object] | None, method: str) -> AcceptanceModel:
    """The acceptance model a simulation uses: the config's own rate or distribution first, else the profile's
    measurement of the same method; none of them is an error naming what to give."""
    if rate is not None and distribution is not None:
        raise UserError("speculative_config: acceptance_rate and acceptance both given; allowed: one of them")
    if rate is not None:
        return from_rate(k, rate)
    if distribution is not None:
        return from_distribution(k, distribution)
    if measured is not None and measured.get("method") == method:
        records = measured.get("counts")
        if isinstance(records, list):
            return from_counts(k, counts_from_records(records),
                               f"measured by the live engine, {measured.get('corpus', 'a corpus')}")
    raise UserError("speculative_config: the simulator needs to know how often drafts are accepted; allowed: "
                    "\"acceptance_rate\": a (each draft accepted with probability a), \"acceptance\": [p0, ..., "
                    f"p{k}], or a calibrated profile with a measured {method} acceptance (kvplan calibrate "
                    "--speculative-config)")


@dataclass(slots=True)
class _Pass:
    """One row group of a draft-model pass, as `step_features` reads scheduled items."""

    num_new_tokens: int
    start_pos: int
    is_decode: bool
    samples: bool = True


class DraftCost:
    """The draft model's forward passes in a step (method `draft_model`; an n-gram proposer runs on the CPU beside
    the GPU and costs nothing here). vLLM's autoregressive drafter first runs over the tokens the target computed
    in the step (prompt chunks included: the draft model keeps its own KV of every request), then k - 1 one-token
    passes for the requests that sampled; `cost` prices those passes as steps of the draft model."""

    __slots__ = ("block_size", "cost", "k")

    def __init__(self, cost, k: int, block_size: int) -> None:
        self.cost, self.k, self.block_size = cost, k, block_size

    def seconds(self, scheduled) -> float:
        from kvplan.sim.cost.features import step_features

        first = [_Pass(item.num_new_tokens, item.start_pos, item.is_decode, item.samples) for item in scheduled]
        if not first:
            return 0.0
        total = float(self.cost.step_times(step_features(first, self.block_size)))
        sampling = [item.start_pos + item.num_new_tokens for item in scheduled if item.samples]
        for j in range(1, self.k):
            if not sampling:
                break
            passes = [_Pass(1, end + j - 1, True) for end in sampling]
            total += float(self.cost.step_times(step_features(passes, self.block_size)))
        return total
