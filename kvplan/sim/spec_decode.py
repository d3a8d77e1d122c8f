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

Each outcome is drawn at a counter-based variate of (seed, request, its verification count) (`uniform`), so a run
is reproducible and a request draws the same whatever its batch, replica or process. The invariant:
0 <= accepted <= drafts <= k.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

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

    def outcome(self, u: float) -> tuple[int, int]:
        """(drafts, accepted) of the proposal whose uniform variate is `u` in [0, 1)."""
        if u < self.no_draft:
            return 0, 0
        u = (u - self.no_draft) / (1.0 - self.no_draft)
        reached = 1.0
        for j, rate in enumerate(self.position_rates):  # P(accepted == j) = reached * (1 - rate)
            stop = reached * (1.0 - rate)
            if u < stop:
                return self.k, j
            u -= stop
            reached *= rate
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
    if not isinstance(probabilities, list | tuple) or len(probabilities) != k + 1:
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


def measured_section(method: str, k: int, counts: Mapping[tuple[int, int], int], corpus: str) -> dict:
    """A profile's `speculative` section: the live engine's verifications, (drafts, accepted, how many)."""
    records = [[d, a, n] for (d, a), n in sorted(counts.items())]
    return {"method": method, "num_speculative_tokens": k, "corpus": corpus, "counts": records}


def verification_counts(steps) -> dict[tuple[int, int], int]:
    """{(drafts verified, accepted): how many} over a live run's recorded steps (`ProfiledStep.spec`)."""
    counts: dict[tuple[int, int], int] = {}
    for step in steps:
        for pair in (step.spec or {}).values():
            counts[pair] = counts.get(pair, 0) + 1
    return counts


def measured_problem(section: object) -> str | None:
    """What is wrong with a profile's `speculative` section (None: nothing)."""
    allowed = ("allowed: {method: ngram | draft_model, num_speculative_tokens: k, corpus: text, counts: [[drafts, "
               "accepted, how many], ...]} with 0 <= accepted <= drafts")
    if not isinstance(section, dict) or not isinstance(section.get("method"), str) \
            or not isinstance(section.get("counts"), list) or not section["counts"]:
        return f"got {section!r:.80}; {allowed}"
    for row in section["counts"]:
        ok = isinstance(row, list) and len(row) == 3 and all(isinstance(x, int) and not isinstance(x, bool)
                                                             for x in row)
        if not ok or not (0 <= row[1] <= row[0] and row[2] >= 1):
            return f"counts: {row!r:.60} is no (drafts, accepted, how many) row; {allowed}"
    return None


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


class DraftCost:
    """The draft model's forward passes in a step (method `draft_model`; an n-gram proposer runs on the CPU beside
    the GPU and costs nothing here). vLLM's autoregressive drafter first runs over the tokens the target computed
    in the step (prompt chunks included: the draft model keeps its own KV of every request), then k - 1 one-token
    passes for the requests that sampled; `cost` prices those passes as steps of the draft model."""

    __slots__ = ("block_size", "cost", "k")

    def __init__(self, cost, k: int, block_size: int) -> None:
        self.cost, self.k, self.block_size = cost, k, block_size

    def seconds(self, scheduled) -> float:
        from kvplan.sim.cost.features import StepItem, step_features

        first = [StepItem(item.num_new_tokens, item.start_pos, item.is_decode, item.samples) for item in scheduled]
        if not first:
            return 0.0
        total = float(self.cost.step_times(step_features(first, self.block_size)))
        sampling = [item.start_pos + item.num_new_tokens for item in scheduled if item.samples]
        for j in range(1, self.k):
            if not sampling:
                break
            passes = [StepItem(1, end + j - 1, True) for end in sampling]
            total += float(self.cost.step_times(step_features(passes, self.block_size)))
        return total


PLACEHOLDER = 0  # the token id of a count-only draft (the scheduler only counts drafts)


MASK64 = (1 << 64) - 1


def uniform(seed: int, key: int, index: int) -> float:
    """A uniform variate in [0, 1) for proposal `index` of request `key`: splitmix64 of the three (a counter-based
    generator: the same draw whatever the batch, the replica or the process a request is simulated in)."""
    z = (seed * 0x9E3779B97F4A7C15 + key * 0xBF58476D1CE4E5B9 + index * 0x94D049BB133111EB) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return ((z ^ (z >> 31)) >> 11) / float(1 << 53)


class DraftOutcomes:
    """The replica's side of speculative decoding (see the module): after each step, the drafts every request that
    sampled proposes for its next step, and - when that step verifies them - how many the target accepts.

    The outcome of a request's j-th verification is `outcome(request id, j)`: the acceptance model's at a
    counter-based uniform variate of (seed, request, j), or, replaying a live run (`kvplan validate`, priced by
    the run's own steps), the drafts and acceptance the live engine recorded. Counting verifications, not
    proposals, keeps both the same when a preemption drops a request's drafts. Invariant: a request's pending
    outcome is the one of the drafts it holds; drafts trimmed by the budget keep the first accepted ones
    (positions are verified in order)."""

    __slots__ = ("_pending", "_verified", "outcome")

    def __init__(self, outcome: Callable[[str, int], tuple[int, int]]) -> None:
        self.outcome = outcome
        self._pending: dict[str, int] = {}
        self._verified: dict[str, int] = {}

    @classmethod
    def drawn(cls, model: AcceptanceModel, seed: int = 0) -> DraftOutcomes:
        return cls(lambda rid, j: model.outcome(uniform(seed, zlib.crc32(rid.encode()), j)))

    @classmethod
    def recorded(cls, k: int, accepted: Mapping[str, Sequence[int]]) -> DraftOutcomes:
        """A live run's outcomes: its proposers always offer k drafts (n-gram pads with the last token, a draft
        model proposes k), and `accepted[request id]` lists what each of its verifications kept."""
        def outcome(rid: str, j: int) -> tuple[int, int]:
            kept = accepted.get(rid, ())
            return k, kept[j] if j < len(kept) else 0
        return cls(outcome)

    def accepted(self, step) -> list[int] | None:
        """Drafts accepted per scheduled item of `step` (None when it verified none)."""
        out, pending, verified, any_drafts = [], self._pending, self._verified, False
        for item in step.scheduled:
            drafts = len(item.spec_token_ids)
            if drafts:
                any_drafts = True
                rid = item.request.request_id
                out.append(min(pending.pop(rid, 0), drafts))
                verified[rid] = verified.get(rid, 0) + 1
            else:
                out.append(0)
        return out if any_drafts else None

    def propose(self, sched) -> None:
        """Give every request the scheduler has take drafts for the next step (`requests_to_draft`) its drafts; a
        request that proposed before without being verified since draws the same outcome again."""
        drafts: dict[str, list[int]] = {}
        for request in sched.requests_to_draft():
            rid = request.request_id
            d, a = self.outcome(rid, self._verified.get(rid, 0))
            if d:
                drafts[rid] = [PLACEHOLDER] * d
                self._pending[rid] = a
        if drafts:
            sched.set_drafts(drafts)

    def forget(self, request_id: str) -> None:
        """A finished request's counters (the replica calls it as requests close)."""
        self._verified.pop(request_id, None)
        self._pending.pop(request_id, None)


def speculation(config, cost, block_size: int) -> tuple[DraftOutcomes | None, DraftCost | None]:
    """A replica's speculative decoding under scheduler config `config` priced by `cost`: (its draft outcomes,
    the draft model's cost or None); both None when it is off.

    A recorded cost (a live run's own steps) replays the run's proposals and its measured step times, which
    include the drafter's work; any other cost draws outcomes from the acceptance model - the config's, else
    the calibrated profile's measured one - and prices a draft model's passes as steps of that model."""
    spec = config.speculative
    if spec is None:
        return None, None
    recorded = getattr(cost, "recorded_acceptance", None)
    if recorded is not None:
        return DraftOutcomes.recorded(spec.num_speculative_tokens, recorded), None
    meta = getattr(cost, "meta", None)
    measured = meta.get("speculative") if isinstance(meta, dict) else None
    model = acceptance_model(spec.num_speculative_tokens, spec.acceptance_rate, spec.acceptance, measured,
                             spec.method)
    draft = None
    if spec.method == "draft_model":
        draft = DraftCost(draft_model_cost(spec.model, cost, block_size), spec.num_speculative_tokens, block_size)
    return DraftOutcomes.drawn(model), draft


def draft_model_cost(name: str | None, cost, block_size: int):
    """The cost model of the draft model: on a GPU the analytic one of its spec on the same hardware and
    parallelism as the target (vLLM's default draft_tensor_parallel_size); on a calibrated device its shipped
    profile."""
    from kvplan.sim.cost.analytic import AnalyticCost
    from kvplan.sim.specs.models import get_model

    if name is None:
        raise UserError("speculative_config.model: the draft_model method needs the draft model; allowed: a "
                        "built-in model name or a model directory")
    if isinstance(cost, AnalyticCost):
        return AnalyticCost(get_model(name), cost.hardware, block_size, cost.kv_dtype_bytes, shape=cost.shape)
    from kvplan.sim.cost.calibrated import load_profile
    from kvplan.sim.specs.profiles import shipped_profile

    device = cost.meta.get("device", "cpu-local") if isinstance(getattr(cost, "meta", None), dict) else "cpu-local"
    try:
        return load_profile(shipped_profile(name, device))
    except ValueError as exc:
        raise UserError(f"speculative_config.model: {exc}; allowed: a draft model with a calibrated profile on "
                        f"{device}, or --cost analytic on a GPU") from None


def speculation_info(counters: dict[str, int]) -> dict[str, float | int | None]:
    """A run's speculative-decoding figures (vLLM's names) from the replicas' summed counters."""
    drafts, proposed, accepted = (counters["num_drafts"], counters["num_draft_tokens"],
                                  counters["num_accepted_tokens"])
    return {"num_drafts": drafts, "num_draft_tokens": proposed, "num_accepted_tokens": accepted,
            "acceptance_rate": accepted / proposed if proposed else None,
            "mean_acceptance_length": 1 + accepted / drafts if drafts else None}


def speculation_note(info: dict) -> str | None:
    """simulate's note line on a run's speculative decoding, or None when it had none."""
    spec = info.get("speculative")
    if spec is None:
        return None
    if not spec["num_drafts"]:
        return "speculative decoding: no step verified drafts"
    return (f"speculative decoding: {spec['num_accepted_tokens']:,} of {spec['num_draft_tokens']:,} drafts accepted "
            f"(acceptance rate {spec['acceptance_rate']:.3f}); {spec['mean_acceptance_length']:.2f} tokens per "
            f"verification step over {spec['num_drafts']:,} verifications")
