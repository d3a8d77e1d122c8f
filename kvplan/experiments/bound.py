"""Analytic bounds on a point's capacity, read from its cost model before anything is simulated: they let a search
skip the probes whose verdict is already known, and a point that no probe could make meet.

    rows per second   R = max over t in [1, max_num_batched_tokens] of  t / T(t)
                      T(t): the cost model's time for a step of t token rows with the least work such a step can
                      have - one request, no attention context, no sampled row, nothing admitted
    rows per request  W = the trace's mean over requests of the rows each needs computed:
                      prompt + output - 1 (the prompt's rows, then one decode row per further token); with prefix
                      caching only `output` (a fully cached prompt still computes its last row); 0 for a request
                      the scheduler rejects (longer than max_model_len, or nothing to serve)
    rate bound        U = R / W requests per second per replica

Why U bounds every stable probe: each request needs at least W rows on average (preemption only recomputes more),
a replica computes at most R rows per second (every step of t rows takes at least T(t), provided the cost model's
step time does not fall when a feature grows - true of the analytic model, a sum of non-negative roofline terms
and overheads, and checked by tests/experiments/test_bound.py), and a sustained load of more rows per second
than the replicas compute grows its queue without end. A steady-state probe is finite, so its gates tolerate a
little overload (a queue growing slowly enough to drain in the grace period, an arrival sample below its mean
rate): a probe is decided to fail only beyond `SLACK` x U x replicas. The session draws of an open loop are
uniform, so the expected rows per request of a probe is the trace's mean W.

The bounds are far above the simulated capacity as a rule (attention, the batch cap and the SLOs bind first):
they skip hopeless probes - very high rates, too few replicas - never the ones near the answer, so a search that
uses them makes the same decisions on what it does simulate and gives the same answer.

A point whose model does not fit the GPU (no KV blocks left) gets no bound: its first probe says so, as before.

A disaggregated point (`PDBound`) splits a request's rows between its pools and adds the KV link; each part is a
server that a sustained load must not outrun, so its bound is the smallest of:

    prefill pool      P x R_p / W_p    R_p as R, on the prefill pool's hardware, TP, PP and token budget;
                                       W_p = prompt rows (1 with prefix caching: a cached prompt computes its last)
    decode pool       D x R_d / W_d    W_d = output - 1 rows (the first token is the prefill pool's)
    KV link           D x B / V        B: a decode instance's link, bytes/s; V: the busiest rank's bytes a request
                                       moves (its prompt's blocks), none when the decode pool caches prefixes (its
                                       local hits are not moved: no lower bound on V, so no link bound)

step_scale stretches the pools' steps, not the link. Each W and V is a least need (rows only ever get recomputed,
blocks only ever moved whole), so each part bounds every stable probe as U does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kvplan.limits import MAX_REPLICAS

SLACK = 1.25  # a probe is decided to fail only above SLACK x the bound (module docstring)


@dataclass(frozen=True, slots=True)
class PointBound:
    """What a point's cost model and trace say before any simulation (module docstring)."""

    rows_per_s: float  # R: token rows one replica computes per second at most
    rows_per_request: float  # W: the mean rows a request needs computed

    @property
    def rate_per_replica(self) -> float:
        """U: requests per second one replica can sustain at most (inf when no request needs work)."""
        return self.rows_per_s / self.rows_per_request if self.rows_per_request > 0 else math.inf

    def max_stable_rate(self, replicas: int, step_scale: float = 1.0) -> float:
        """The rate above which a probe of `replicas` replicas is decided to fail: SLACK x U x replicas (every step
        `step_scale` times as long: U / step_scale)."""
        return SLACK * self.rate_per_replica / step_scale * replicas

    def min_replicas(self, rate: float, step_scale: float = 1.0) -> int:
        """The fewest replicas a probe at `rate` req/s may meet with: fewer are decided to fail."""
        per = SLACK * self.rate_per_replica / step_scale
        return max(1, math.ceil(rate / per)) if math.isfinite(per) and per > 0 else 1

    def as_text(self) -> str:
        return (f"at most {self.rate_per_replica:.3g} req/s per replica ({self.rows_per_s:.4g} token rows/s over "
                f"{self.rows_per_request:.4g} rows per request)")


@dataclass(frozen=True, slots=True)
class PartBound:
    """One part of a disaggregated deployment: a pool (token rows) or the KV link (bytes); module docstring."""

    name: str  # "prefill pool", "decode pool", "KV link"
    per_s: float  # rows (bytes) one instance serves per second at most
    per_request: float  # rows (bytes) a request needs from it, at least, on average
    instances: int
    compute: bool  # a pool's steps (step_scale stretches them); not the link

    def rate(self, step_scale: float = 1.0) -> float:
        """Requests per second the part can sustain at most (inf when no request needs it)."""
        if self.per_request <= 0:
            return math.inf
        return self.instances * self.per_s / self.per_request / (step_scale if self.compute else 1.0)


@dataclass(frozen=True, slots=True)
class PDBound:
    """A disaggregated point's bound: the smallest of its parts' (module docstring)."""

    parts: tuple[PartBound, ...]

    def max_stable_rate(self, replicas: int, step_scale: float = 1.0) -> float:
        """SLACK x the smallest part's rate; `replicas` (cluster.replicas) is unused: the pools have their own."""
        return SLACK * min(part.rate(step_scale) for part in self.parts)

    def min_replicas(self, rate: float, step_scale: float = 1.0) -> int:
        """The fewest decode replicas a probe at `rate` req/s may meet with (a P/D point's replica search varies
        its decode pool: `pd_block.varied_key`): each part that grows with them - the decode pool, the links - needs
        rate / (SLACK x its rate per instance); past MAX_REPLICAS when the prefill pool alone cannot keep up."""
        fewest = 1
        for part in self.parts:
            rate_per = SLACK * part.rate(step_scale) / part.instances
            if part.name == "prefill pool":
                if SLACK * part.rate(step_scale) < rate:
                    return MAX_REPLICAS + 1
            elif math.isfinite(rate_per) and rate_per > 0:
                fewest = max(fewest, math.ceil(rate / rate_per))
        return fewest

    def as_text(self) -> str:
        binding = min(self.parts, key=lambda part: part.rate())
        unit = "token rows" if binding.compute else "bytes"
        others = "; ".join(f"{part.name} {part.rate():.3g}" for part in self.parts if part is not binding)
        return (f"at most {binding.rate():.3g} req/s by the {binding.name} ({binding.instances} x {binding.per_s:.4g} "
                f"{unit}/s over {binding.per_request:.4g} per request; {others} req/s)")


def step_floor(cost, tokens: np.ndarray):  # cost: sim.cost.CostModel -> seconds per step, per entry of tokens
    """T(t) for each t of `tokens` (>= 1): a step of t rows with the least work (module docstring)."""
    from kvplan.sim.cost.features import StepFeatures

    t = np.asarray(tokens, dtype=np.int64)
    one, zero = np.ones_like(t), np.zeros_like(t)
    features = StepFeatures(num_requests=one, prefill_tokens=t - 1, prefill_attention2=zero, decode_requests=one,
                            decode_context=zero, decode_context_max=zero, blocks_touched=zero, sampled=zero,
                            batched=(t >= 2).astype(np.int64))
    return np.asarray(cost.step_times(features), dtype=np.float64)


def point_bound(config: dict) -> PointBound | PDBound | None:
    """The bounds of one run configuration (a point's, any seed: the trace's population is the same); None when
    the model leaves no KV memory on the GPU (the simulator refuses such a point)."""
    from kvplan.experiments.execute import build_spec, population
    from kvplan.sim.run import resolve_max_model_len

    spec = build_spec(config)
    trace = population(config).trace
    max_len = resolve_max_model_len(spec, trace)
    served = trace.servable & (trace.prompt_tokens + trace.output_tokens <= max_len)
    prompt, output = trace.prompt_tokens[served], trace.output_tokens[served]
    if spec.disaggregation is not None:
        return _pd_bound(spec, trace, prompt, output)
    rows = output if spec.enable_prefix_caching else prompt + output - 1
    per_s = _rows_per_s(spec, trace)
    return None if per_s is None else PointBound(per_s, float(rows.sum()) / len(trace))


def _rows_per_s(spec, trace) -> float | None:  # spec: sim.spec.SimSpec, trace: traces.Trace
    """R: the most token rows one replica of `spec` computes per second (None: no KV memory left)."""
    from kvplan.sim.run import build_configs, build_cost

    cost, num_blocks = build_cost(spec)
    if num_blocks < 1:
        return None
    _, sched = build_configs(spec, trace, num_blocks, cost)
    tokens = np.arange(1, max(int(sched.max_num_batched_tokens), 1) + 1)
    return float((tokens / step_floor(cost, tokens)).max())


def _pd_bound(spec, trace, prompt: np.ndarray, output: np.ndarray) -> PDBound | None:
    """`PDBound` of a disaggregated spec, over the served requests' lengths (module docstring)."""
    from kvplan.sim.pd_transfer import link_figures, rank_bytes_per_token
    from kvplan.sim.run import build_cost

    pd = spec.disaggregation
    p_spec, d_spec = pd.pool_specs(spec)
    rates = [_rows_per_s(pool, trace) for pool in (p_spec, d_spec)]
    if rates[0] is None or rates[1] is None:
        return None
    n = len(trace)
    prefill_rows = np.ones_like(prompt) if p_spec.enable_prefix_caching else prompt
    parts = [PartBound("prefill pool", rates[0], float(prefill_rows.sum()) / n, pd.prefill_replicas, True),
             PartBound("decode pool", rates[1], float((output - 1).sum()) / n, pd.decode_replicas, True)]
    if not d_spec.enable_prefix_caching:
        cost, _ = build_cost(d_spec)
        p_tp, d_tp = pd.tp(spec)
        _, busiest = rank_bytes_per_token(cost.model, cost.kv_dtype_bytes, p_tp, d_tp, p_spec.pipeline_parallel_size,
                                          d_spec.pipeline_parallel_size)
        bandwidth, _ = link_figures(pd, p_spec.hardware, d_spec.hardware)
        blocks = -(-prompt // d_spec.kv_block_size)
        parts.append(PartBound("KV link", bandwidth, float(blocks.sum()) * d_spec.kv_block_size * busiest / n,
                               pd.decode_replicas, False))
    return PDBound(tuple(parts))
