"""The analytic cost's step law on plain numbers: one step, or a pure-decode stretch in one typed loop.

`AnalyticCost.step_times` prices a step's `StepFeatures` on plain ints and a decode stretch's on int64 arrays, with
the same IEEE operations either way. Through its layers (features dataclass, token tables, the attention model,
numpy's per-call overhead on a stretch's few dozen entries) that costs microseconds per step or stretch, more than
the simulated work around it. For the cases it covers (one pipeline stage, no sliding-window layers),
`AnalyticCost.step_law` hands its constants and count tables to a `StepLaw`, which makes the same operations in
the same order on the step's numbers (M = prefill tokens + decodes, S = sampled rows, n = requests):

    attention = max((prefill_unit × (A2 / 2 + k0 × prefill) [if any prefill]) + decode_unit × Σ context) / flop_rate,
                    token_bytes × (Σ blocks × block_tokens [+ request_tokens × decodes]) / byte_rate) + floor
    compute   = linear[M] + head[S] + attention [+ experts[M]] [+ collectives[M]]
    host      = step_s + request_s × n [+ admit_s × (n - decodes)]
    time      = max(compute, host) with async scheduling, else compute + host;  × scale (`ScaledCost`'s factor)

A pure-decode step (M = S = n = decodes, no prefill) is the same with linear[n] + head[n] read as one table
(`_decode_linear`, their sum). So each time is `step_times`' answer, bit for bit (tests/sim/test_step_law.py).
`AnalyticCost` stays the definition: it builds the law from its own fields and tables, and prices every step the
law does not cover itself (a count beyond the tables: `step` and `times` answer None). Compiled with the
simulator's step loop (the install's build), the arithmetic runs on C doubles.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.sim.cost.token_table import TokenTable


@dataclass(slots=True)
class StepLaw:
    """A step's seconds from its integer features (see the module). The count tables are the model's own
    `TokenTable`s (looked up by count, grown as they grow)."""

    linear: TokenTable  # element-wise ops and layer GEMMs over M rows (`AnalyticCost._linear`)
    head: TokenTable  # the LM head over S rows
    decode_linear: TokenTable  # linear[n] + head[n]: a decode step's (`AnalyticCost._decode_linear`)
    experts: TokenTable | None  # an MoE model's routed experts over M rows
    collectives: TokenTable | None  # TP collectives over M rows
    prefill_unit: float  # attention FLOPs per query-key pair of a prefill, per query (`AttentionCost`)
    queries_k0: float
    decode_unit: float  # attention FLOPs per attended token of a decode
    block_tokens: float  # tokens' worth of KV read per block touched (block size + gather overhead)
    request_tokens: float  # tokens' worth of KV read per decoding request (0: none)
    flop_rate: float
    token_bytes: float
    byte_rate: float
    floor: float  # the attention kernels' per-layer floors
    step_s: float  # host work per step, per request, per admitted prefill
    request_s: float
    admit_s: float
    async_scheduling: bool
    scale: float = 1.0  # `ScaledCost`'s factor (x × 1.0 is x: an unscaled model's times are unchanged)

    def scaled(self, factor: float) -> StepLaw | None:
        """This law with its times × `factor` after everything else, as `ScaledCost` multiplies; None for a law
        already scaled (t × a × b is not always t × (a × b): a scaled `ScaledCost` prices steps itself)."""
        if self.scale != 1.0:
            return None
        return StepLaw(self.linear, self.head, self.decode_linear, self.experts, self.collectives,
                       self.prefill_unit, self.queries_k0, self.decode_unit, self.block_tokens, self.request_tokens,
                       self.flop_rate, self.token_bytes, self.byte_rate, self.floor, self.step_s, self.request_s,
                       self.admit_s, self.async_scheduling, factor)

    def step(self, sums: tuple[int, ...]) -> float | None:
        """Seconds of one step from its `step_sums.scheduled_sums` (the `StepFeatures` fields in order), or None
        when it has window features (a sliding-window model has no law) or a count beyond the tables."""
        requests, prefill, attention2, decodes, context, _, blocks, sampled, _, w2, wc, wb = sums
        if w2 or wc or wb:
            return None
        tokens = decodes + prefill
        linear = _values(self.linear, tokens)
        head = _values(self.head, sampled)
        if linear is None or head is None or (self.experts is not None and _values(self.experts, tokens) is None) or (
                self.collectives is not None and _values(self.collectives, tokens) is None):
            return None
        compute = self.decode_unit * context
        if attention2 or prefill:
            compute = self.prefill_unit * (attention2 / 2.0 + self.queries_k0 * prefill) + compute
        seconds = linear[tokens] + head[sampled] + self._attention(compute, blocks, decodes)
        seconds = self._parallel(seconds, tokens)
        host = self.step_s + self.request_s * requests
        if requests != decodes:  # (adding admit × 0 = +0.0 would change no bit)
            host = host + self.admit_s * (requests - decodes)
        return self._combine(seconds, host)

    def times(self, live: list[int], attended: list[int], blocks: list[int]) -> list[float] | None:
        """Seconds of each step j of a pure-decode stretch with live[j] requests attending attended[j] tokens
        over blocks[j] blocks (`step_sums.stretch_sums`); None when a count lies beyond the tables."""
        if not live:
            return []
        top = max(live)
        decode_linear = _values(self.decode_linear, top)
        if decode_linear is None or (self.experts is not None and _values(self.experts, top) is None) or (
                self.collectives is not None and _values(self.collectives, top) is None):
            return None
        decode_unit, step_s, request_s = self.decode_unit, self.step_s, self.request_s
        out = [0.0] * len(live)
        for j in range(len(live)):
            n = live[j]
            compute = decode_linear[n] + self._attention(decode_unit * attended[j], blocks[j], n)
            out[j] = self._combine(self._parallel(compute, n), step_s + request_s * n)
        return out

    def _attention(self, compute: float, blocks: int, decodes: int) -> float:
        """The attention kernels' seconds: their FLOPs `compute` or their KV reads, whichever binds, plus the
        floors."""
        read = blocks * self.block_tokens
        if self.request_tokens:
            read = read + self.request_tokens * decodes
        flops = compute / self.flop_rate
        bytes_read = self.token_bytes * read / self.byte_rate
        return (flops if flops >= bytes_read else bytes_read) + self.floor

    def _parallel(self, compute: float, tokens: int) -> float:
        """`compute` plus the routed experts and the TP collectives over `tokens` rows (the callers grew both
        tables to cover it)."""
        if self.experts is not None:
            compute = compute + self.experts._values[tokens]
        if self.collectives is not None:
            compute = compute + self.collectives._values[tokens]
        return compute

    def _combine(self, compute: float, host: float) -> float:
        """The step's time from its GPU and host seconds (overlapped under async scheduling), scaled."""
        return ((compute if compute >= host else host) if self.async_scheduling else compute + host) * self.scale


def _values(table: TokenTable, top: int) -> list[float] | None:
    """The table's entries for the counts 0 .. top (grown to cover top), or None when top is beyond its limit
    (or negative)."""
    if top >= len(table._values):
        if top >= table.limit:
            return None
        table.at(top)  # grows it
    return table._values if top >= 0 else None
