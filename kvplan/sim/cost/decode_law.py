"""The analytic cost's law for a pure-decode step, on plain numbers: a decode stretch priced in one typed loop.

A stretch of k pure-decode steps (`features.decode_stretch_features`) has three features per step that vary: the
requests still decoding n, the tokens they attend Σ context and the KV blocks they read Σ blocks
(`step_sums.stretch_sums` gives them as lists). `AnalyticCost.step_times` prices such a stretch on int64 arrays
with about fifteen numpy operations, each mostly call overhead at a stretch's size (a few dozen steps). For the
cases it covers, `AnalyticCost.decode_law` hands its constants and count tables to a `DecodeLaw`, which makes the
same IEEE operations in the same order on each step's numbers:

    compute = linear[n] + (max(decode_unit × Σ context / flop_rate,
                               token_bytes × (Σ blocks × block_tokens [+ request_tokens × n]) / byte_rate) + floor)
              [+ experts[n]] [+ collectives[n]]
    host    = step_s + request_s × n
    time    = max(compute, host) with async scheduling, else compute + host;  × scale (`ScaledCost`'s factor)

so each step's time is the array path's entry, bit for bit (tests/sim/test_decode_law.py). `AnalyticCost` stays
the definition: it builds the law from its own fields and tables, and prices every other step, and every stretch
the law does not cover (pipeline parallelism, sliding-window layers), itself. Compiled with the simulator's step
loop, the loop runs on C doubles.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.sim.cost.token_table import TokenTable


@dataclass(slots=True)
class DecodeLaw:
    """A pure-decode step's seconds from (n, Σ context, Σ blocks) (see the module). The count tables are the
    model's own `TokenTable`s (looked up by n, grown as they grow)."""

    linear: TokenTable  # linear layers + LM head over n rows (`AnalyticCost._decode_linear`)
    experts: TokenTable | None  # an MoE model's routed experts over n rows
    collectives: TokenTable | None  # TP collectives over n rows
    decode_unit: float  # attention FLOPs per attended token (`AttentionCost._decode_unit`)
    block_tokens: float  # tokens' worth of KV read per block touched (block size + gather overhead)
    request_tokens: float  # tokens' worth of KV read per decoding request (0: none)
    flop_rate: float
    token_bytes: float
    byte_rate: float
    floor: float  # the attention kernels' per-layer floors
    step_s: float  # host work per step and per request
    request_s: float
    async_scheduling: bool
    scale: float = 1.0  # `ScaledCost`'s factor (x × 1.0 is x: an unscaled model's times are unchanged)

    def scaled(self, factor: float) -> DecodeLaw | None:
        """This law with its times × `factor` after everything else, as `ScaledCost` multiplies; None for a law
        already scaled (t × a × b is not always t × (a × b): a scaled `ScaledCost` prices its stretches itself)."""
        if self.scale != 1.0:
            return None
        return DecodeLaw(self.linear, self.experts, self.collectives, self.decode_unit, self.block_tokens,
                         self.request_tokens, self.flop_rate, self.token_bytes, self.byte_rate, self.floor,
                         self.step_s, self.request_s, self.async_scheduling, factor)

    def times(self, live: list[int], attended: list[int], blocks: list[int]) -> list[float] | None:
        """Seconds of each step j with live[j] requests attending attended[j] tokens over blocks[j] blocks; None
        when a count lies beyond the tables (the model prices such a stretch itself)."""
        if not live:
            return []
        top = max(live)
        linear = _values(self.linear, top)
        experts = _values(self.experts, top) if self.experts is not None else None
        collectives = _values(self.collectives, top) if self.collectives is not None else None
        if linear is None or (self.experts is not None and experts is None) or (
                self.collectives is not None and collectives is None):
            return None
        decode_unit, block_tokens, request_tokens = self.decode_unit, self.block_tokens, self.request_tokens
        flop_rate, token_bytes, byte_rate, floor = self.flop_rate, self.token_bytes, self.byte_rate, self.floor
        step_s, request_s, overlap, scale = self.step_s, self.request_s, self.async_scheduling, self.scale
        out = [0.0] * len(live)
        for j in range(len(live)):
            n = live[j]
            compute = decode_unit * attended[j]
            read = blocks[j] * block_tokens
            if request_tokens:
                read = read + request_tokens * n
            flops = compute / flop_rate
            bytes_read = token_bytes * read / byte_rate
            step = linear[n] + ((flops if flops >= bytes_read else bytes_read) + floor)
            if experts is not None:
                step = step + experts[n]
            if collectives is not None:
                step = step + collectives[n]
            host = step_s + request_s * n
            out[j] = ((step if step >= host else host) if overlap else step + host) * scale
        return out


def _values(table: TokenTable, top: int) -> list[float] | None:
    """The table's entries for the counts 0 .. top (grown to cover top), or None when top is beyond its limit."""
    if top >= len(table._values):
        if top >= table.limit:
            return None
        table.at(top)  # grows it
    return table._values
