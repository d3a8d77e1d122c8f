"""Trace transforms. Each returns a new Trace (arrays are never modified in place) and notes what it did in
the trace's report, so a derived trace says how it was derived."""

from __future__ import annotations

from dataclasses import replace
from hashlib import blake2b

import numpy as np

from kvplan.errors import UserError
from kvplan.traces.arrivals import arrival_times
from kvplan.traces.schema import MAX_ARRIVAL_S, NO_VALUE, Trace, gather_segments

DIGEST_IDS = 8  # one 64-byte blake2b digest yields eight 64-bit ids


def _noted(trace: Trace, note: str) -> Trace:
    report = replace(trace.report, bad_lines=list(trace.report.bad_lines), notes=[*trace.report.notes, note])
    return replace(trace, report=report)


def _on_clock(trace: Trace, what: str) -> Trace:
    """A transform's result, if every arrival is still a time float64 resolves: a rate scale of 1e-300 or a
    jitter of 1e300 puts arrivals where TTFT and E2E round to 0 (silently wrong), so it is refused."""
    latest = float(trace.arrival_s.max()) if len(trace) else 0.0
    if not latest <= MAX_ARRIVAL_S:
        raise UserError(f"{what} puts arrivals at {latest:.3g} s; allowed: arrivals within {MAX_ARRIVAL_S:g} s "
                         "(float64 seconds resolve microseconds only up to there)")
    return trace


def _positive(name: str, value: float) -> None:
    if not value > 0:
        raise UserError(f"{name} must be > 0, got {value!r}")


def window(trace: Trace, start_s: float, end_s: float | None = None) -> Trace:
    """Requests arriving in [start_s, end_s), re-based so that the window starts at 0."""
    end = np.inf if end_s is None else end_s
    if end <= start_s:
        raise UserError(f"window end {end_s} must be after its start {start_s}")
    mask = (trace.arrival_s >= start_s) & (trace.arrival_s < end)
    out = trace.take(mask)
    out.arrival_s = out.arrival_s - start_s
    return _noted(out, f"window [{start_s:g}, {end:g}) s kept {len(out)} of {len(trace)} requests")


def scale_rate(trace: Trace, factor: float) -> Trace:
    """Multiply the request rate by `factor` (> 1 compresses time, < 1 stretches it)."""
    _positive("rate factor", factor)
    out = _on_clock(replace(trace, arrival_s=trace.arrival_s / factor), f"rate factor {factor:g}")
    return _noted(out, f"rate scaled x{factor:g}")


def retime(trace: Trace, arrivals: dict, seed: int, path: str = "arrivals") -> Trace:
    """New arrival times from an arrival-process spec (see `traces.arrivals`), keeping order and lengths.

    `path` names the spec in error messages (its YAML key, or the command-line option).
    """
    times = arrival_times(arrivals, len(trace), np.random.default_rng(seed), path)
    out = replace(trace, arrival_s=times - times[0] if len(times) else times, timed=True)
    return _noted(out, f"re-timed with {arrivals.get('process', 'poisson')} arrivals (seed {seed})")


def sample(trace: Trace, fraction: float, seed: int) -> Trace:
    """A uniform random subset of round(fraction * n) requests, in arrival order."""
    if not 0 < fraction <= 1:
        raise UserError(f"sample fraction must be in (0, 1], got {fraction!r}")
    rng = np.random.default_rng(seed)
    keep = np.sort(rng.choice(len(trace), size=round(fraction * len(trace)), replace=False))
    return _noted(trace.take(keep), f"sampled {len(keep)} of {len(trace)} requests (seed {seed})")


def clip_to_context(trace: Trace, context: int) -> Trace:
    """Fit every request in a model's context: prompt <= context - 1, then prompt + output <= context.

    Prefix hashes past the clipped prompt are dropped with it.
    """
    if context < 2:
        raise UserError(f"context must be >= 2 tokens, got {context}")
    prompt = np.minimum(trace.prompt_tokens, context - 1)
    output = np.minimum(trace.output_tokens, context - prompt)
    changed = int(np.count_nonzero((prompt != trace.prompt_tokens) | (output != trace.output_tokens)))
    out = replace(trace, prompt_tokens=prompt, output_tokens=output)
    if trace.has_prefix:
        keep = -(-prompt // trace.hash_granularity)  # blocks still (partly) inside the prompt
        out.hash_ids, out.hash_offsets = gather_segments(trace.hash_ids, trace.hash_offsets,
                                                         np.arange(len(trace)), keep)
    return _noted(out, f"clipped {changed} requests to a {context}-token context")


def jitter(trace: Trace, quantum_s: float, seed: int) -> Trace:
    """Spread timestamps rounded to `quantum_s` uniformly over [t, t + quantum_s), then re-sort.

    The Mooncake conversation trace rounds arrivals to about 3 s; replaying it as is sends bursts of
    simultaneous requests that the real service never saw.
    """
    _positive("jitter quantum", quantum_s)
    rng = np.random.default_rng(seed)
    shifted = trace.arrival_s + rng.uniform(0.0, quantum_s, size=len(trace))
    order = np.argsort(shifted, kind="stable")
    out = trace.take(order)
    out.arrival_s = shifted[order]
    _on_clock(out, f"jitter quantum {quantum_s:g} s")
    return _noted(out, f"jittered arrivals within {quantum_s:g} s (seed {seed})")


def expand_granularity(trace: Trace, block_size: int) -> Trace:
    """Re-express prefix hashes at granularity G as hashes at block size b (G a multiple of b).

    Hash h becomes G/b derived ids blake2b(h, j), so two requests share their first k*G/b new ids exactly when
    they shared their first k old ones. Sub-blocks wholly past the prompt are dropped.
    """
    if not trace.has_prefix:
        raise UserError("the trace has no prefix hashes to expand")
    g = trace.hash_granularity
    if block_size < 1 or g % block_size:
        raise UserError(f"hash granularity {g} is not a multiple of block size {block_size}; "
                         "allowed: a block size that divides it")
    per_hash = g // block_size
    unique, inverse = np.unique(trace.hash_ids, return_inverse=True)
    table = derived_ids(unique, per_hash)
    flat = table[inverse].reshape(-1)
    counts = np.diff(trace.hash_offsets)
    keep = np.minimum(-(-trace.prompt_tokens // block_size), counts * per_hash)
    ids, offsets = gather_segments(flat, trace.hash_offsets * per_hash, np.arange(len(trace)), keep)
    out = replace(trace, hash_ids=ids, hash_offsets=offsets, hash_granularity=block_size)
    return _noted(out, f"expanded hash granularity {g} to block size {block_size}")


def compact_hash_ids(trace: Trace) -> Trace:
    """Renumber hash ids 0, 1, 2, ... in order of first appearance (as Mooncake's remapped ids): the same
    sharing, shorter files."""
    if not trace.has_prefix:
        return trace
    return replace(trace, hash_ids=first_appearance_ranks(trace.hash_ids))


def first_appearance_ranks(ids: np.ndarray) -> np.ndarray:
    unique_first, inverse = np.unique(ids, return_index=True, return_inverse=True)[1:]
    rank = np.empty(len(unique_first), dtype=np.int64)
    rank[np.argsort(unique_first)] = np.arange(len(unique_first))
    return rank[inverse]


def derived_ids(hashes: np.ndarray, per_hash: int) -> np.ndarray:
    """[len(hashes), per_hash] process-stable 63-bit ids: id(h, j) from blake2b keyed by (h, j // 8)."""
    digests_per_hash = -(-per_hash // DIGEST_IDS)
    raw = b"".join(
        blake2b(int(h).to_bytes(8, "little") + d.to_bytes(8, "little"), digest_size=64,
                person=b"kvplan-expand").digest()
        for h in hashes.tolist() for d in range(digests_per_hash))
    words = np.frombuffer(raw, dtype="<u8").reshape(len(hashes), digests_per_hash * DIGEST_IDS)
    return (words[:, :per_hash] >> np.uint64(1)).astype(np.int64)



# The order `kvplan trace convert` and an experiment's workload.transforms apply transforms in.
def assign_adapters(trace: Trace, adapters: int, skew: float = 0.0, base_fraction: float = 0.0,
                    seed: int = 0) -> Trace:
    """Every session (every request, where sessions are unknown) served by one of `adapters` LoRA adapters,
    lora-1 .. lora-N, drawn with Zipf popularity: adapter i with probability proportional to i^-skew (0: all
    equally popular; about 1: the popularity multi-LoRA studies use); a share `base_fraction` of the sessions stays
    on the base model. A multi-turn conversation stays with its adapter; replaces any adapters the trace named."""
    if isinstance(adapters, bool) or not isinstance(adapters, int) or not 1 <= adapters <= 100_000:
        raise UserError(f"adapters: {adapters!r}; allowed: an integer >= 1 and <= 100000")
    if not 0 <= skew <= 100:
        raise UserError(f"adapter skew: {skew!r}; allowed: a number >= 0 and <= 100 (0: uniform popularity)")
    if not 0 <= base_fraction < 1:
        raise UserError(f"base fraction: {base_fraction!r}; allowed: a number >= 0 and < 1")
    weights = np.arange(1, adapters + 1, dtype=np.float64) ** -float(skew)
    sessions = trace.session_id != NO_VALUE
    units = np.where(sessions, trace.session_id, -1 - np.arange(len(trace), dtype=np.int64))
    keys, unit = np.unique(units, return_inverse=True)
    rng = np.random.default_rng(seed)
    drawn = rng.choice(adapters, size=len(keys), p=weights / weights.sum()) + 1
    drawn[rng.random(len(keys)) < base_fraction] = 0
    names = tuple(f"lora-{i + 1}" for i in range(adapters))
    out = trace.with_columns(lora=drawn[unit].astype(np.int64), lora_names=names)
    return _noted(out, f"LoRA adapters: {adapters} (Zipf skew {skew:g}, base fraction {base_fraction:g}, seed "
                       f"{seed}) over {len(keys)} {'sessions' if np.any(sessions) else 'requests'}")


TRANSFORM_ORDER = ("window", "sample", "rate_scale", "retime", "jitter", "clip_context", "expand_block")


def _number(value: object, where: str, *, integer: bool = False) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and np.isfinite(value)
    if not ok or (integer and not float(value).is_integer()):
        raise UserError(f"{where}: must be {'an integer' if integer else 'a finite number'}, got {value!r}")
    return int(value) if integer else float(value)


def apply_transforms(trace: Trace, steps: dict, seed: int, path: str | None = None) -> Trace:
    """Apply the transforms named in `steps` (name -> argument) in `TRANSFORM_ORDER`; an error names the YAML
    key `path.name`, or the command-line option (`--clip-context`) when `path` is None. Random transforms
    (sample, retime, jitter) draw from `seed`."""
    def label(name: str) -> str:
        return f"{path}.{name}" if path else "--" + name.replace("_", "-")

    for name in steps:
        if name not in TRANSFORM_ORDER:
            raise UserError(f"{label(name)}: unknown transform; allowed: {', '.join(TRANSFORM_ORDER)}")
    for name in (n for n in TRANSFORM_ORDER if steps.get(n) is not None):
        value, where = steps[name], label(name)
        try:
            if name == "window":
                if not isinstance(value, list | tuple) or len(value) != 2:
                    raise UserError(f"must be [START_S, END_S], got {value!r}")
                trace = window(trace, _number(value[0], f"{where}[0]"), _number(value[1], f"{where}[1]"))
            elif name == "sample":
                trace = sample(trace, _number(value, where), seed)
            elif name == "rate_scale":
                trace = scale_rate(trace, _number(value, where))
            elif name == "retime":
                if not isinstance(value, dict):
                    raise UserError(f"must be an arrival-process mapping, e.g. {{process: poisson, rate: 4}}, "
                                     f"got {value!r}")
                trace = retime(trace, value, seed, path=where)
            elif name == "jitter":
                trace = jitter(trace, _number(value, where), seed)
            elif name == "clip_context":
                trace = clip_to_context(trace, _number(value, where, integer=True))
            else:
                trace = expand_granularity(trace, _number(value, where, integer=True))
        except ValueError as exc:
            message = str(exc)
            raise UserError(message if message.startswith(where) else f"{where}: {message}") from None
    return trace
