"""A calibrated profile from an endpoint replay (`kvplan calibrate --from-replay DIR`): what a black box allows.

A continuous-batching server emits at most one token per running sequence per engine step, all at the step's
end, so the token times of all sequences (DIR/tokens.jsonl), pooled and sorted, cluster into steps:

1. Cut where the gap to the previous stamp exceeds GAP_FRACTION × the median gap between a sequence's tokens
   (about one step; one step's stamps spread only by per-stream work in server and client: on `kvplan serve`
   tiny-llama mostly < 0.6 ms against 2.5 ms steps). A sequence twice in a cluster means two steps merged: cut
   at the largest gap after its first stamp there.
2. A step ends at its earliest stamp: every stream's delay from the step's end to the client's read is >= 0.
3. Rows: token k >= 1 is a decode of token k-1 at position prompt + k - 1, attending prompt + k tokens (the new
   one included, as `step_features` counts); token 0 is its request's prefill (one row for n > 1 samples): the
   prompt minus the cached tokens the server's usage reported.
4. A duration (end − previous end) is kept only when it is measured: the server was busy across it (a sequence
   unfinished there was in the server at the previous end: its first token had come, or it was sent a typical
   step before, since the HTTP hop to an idle server is not step time), no sequence's tokens came in a burst
   there (two closer than the threshold: a multi-token chunk or a stalled stream flushing; the steps from its
   token before to the one after are unmeasured), and no sequence skipped it between two tokens though it holds
   decodes (every running sequence decodes in every decode step: a skipped cluster is a piece of a step whose
   streams were read apart; it and the next are dropped).
5. The live calibration's robust NNLS on relative error, 20% held out (seeded), over the coefficients this data
   identifies (`_identify`); the rest are fixed at 0 and listed in fit.unidentified with the reason.

Limits: a step that emits no token is invisible: a chunked prefill's earlier chunks are priced into the step of
its first token, a recompute after preemption into the gap before the sequence's next token. A server that
caches prefixes without reporting cached tokens overstates prefill (fit.warnings says so). The server's own work
between steps (detokenizing, HTTP) counts as step time, as a user sees it. Swaps and copies never show. A late
read of a stream that runs alone cannot be told from a slow step: the robust fit has to absorb it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from kvplan.calibration.fitting import HOLDOUT_FRACTION, Calibration, fit_quality
from kvplan.calibration.replay_dir import read_replay
from kvplan.errors import UserError
from kvplan.sim.cost.calibrated import COEFFICIENTS, CalibratedCost, feature_columns
from kvplan.sim.cost.features import StepItem, step_features
from kvplan.sim.cost.fit import fit_with_holdout

GAP_FRACTION = 0.3
MIN_STEPS = 4 * len(COEFFICIENTS)  # as the live calibration: a few steps per coefficient
# A column whose part not explained by the columns before it is under 2% of its norm (variance inflation over
# 2,500) is not identified: its coefficient would only trade against theirs.
RANK_TOLERANCE = 0.02
NEVER_SEEN = "a black box never shows swaps or copies"


@dataclass(slots=True)
class ReplayCalibration:
    calibration: Calibration
    url: str | None
    clusters: int  # token clusters found (steps seen), measurable or not


@dataclass(slots=True)
class _Stamps:
    """Every token a client saw, sequence by sequence (sequences in table order), and the step it came in."""

    seq: np.ndarray
    k: np.ndarray  # its index in the sequence
    time: np.ndarray


def calibrate_from_replay(directory: str | Path, block_size: int | None = None, seed: int = 0) -> ReplayCalibration:
    """Fit a profile from a replay directory; `block_size` when the server does not state its own."""
    directory = Path(directory)
    replay = read_replay(directory)
    endpoint, table, times = replay.endpoint, replay.table, replay.times
    served, capacity = replay.block_size, replay.num_gpu_blocks
    if served is not None and block_size is not None and served != block_size:
        raise UserError(f"--block-sizes: {block_size} differs from the server's block_size {served} "
                         f"({directory / 'endpoint.json'}); allowed: {served}")
    block_size = served or block_size or 16
    stamps = _Stamps(np.repeat(np.arange(len(times)), [len(t) for t in times]),
                     np.concatenate([np.arange(len(t)) for t in times]), np.concatenate(times))
    cluster, end, usable, threshold = _reconstruct(stamps, table["first_scheduled_s"].to_numpy(),
                                                   directory / "tokens.jsonl")
    steps = _rows(stamps, cluster, table, usable)
    x = np.array([feature_columns(step_features(s, block_size)) for s in steps], dtype=np.float64)
    t = end[usable] - end[usable - 1]
    kept, unidentified = _identify(x, t)
    holdout = np.random.default_rng(seed).random(len(t)) < HOLDOUT_FRACTION
    fit = fit_with_holdout(x[:, kept], t, holdout)
    coefficients = dict.fromkeys(COEFFICIENTS, 0.0)
    coefficients.update({COEFFICIENTS[j]: float(c) for j, c in zip(kept, fit.coefficients, strict=True)})
    unidentified.update(swap_seconds_per_block=NEVER_SEEN, copy_seconds_per_block=NEVER_SEEN)
    # the longest prompt the fit saw: beyond it the prefill price is an extrapolation (validate says so)
    doc = {"source": "endpoint replay", "token_clusters": len(end), "gap_threshold_ms": round(threshold * 1e3, 4),
           "longest_prompt_tokens": int(table["prompt_tokens"].max())}
    kv_source = ((endpoint.get("server") or {}).get("kv_config") or {}).get("source") or "vllm:cache_config_info"
    if capacity is None:
        unidentified["kv_capacity_blocks"] = "the server does not expose its KV capacity (endpoint.json)"
    else:
        doc["kv_capacity_source"] = f"server {kv_source} (endpoint.json)"
    cost = CalibratedCost(coefficients, kv_capacity_blocks=capacity)
    predicted = x[:, kept] @ fit.coefficients
    kinds = kinds_of(steps)
    cost.meta.update(block_size=block_size, block_sizes=[block_size], fit={
        **fit_quality(fit, predicted, t, holdout, kinds), **doc, "unidentified": unidentified,
        "method": "steps reconstructed from token times; non-negative least squares on relative error, "
                  "Huber-reweighted; 20% of steps held out",
        **_warnings(endpoint, table["cached_prompt_tokens"].to_numpy(), coefficients, kinds)})
    return ReplayCalibration(Calibration(cost, t, predicted, holdout, kinds), endpoint.get("url"), len(end))


def _reconstruct(stamps: _Stamps, sent: np.ndarray, path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """Each stamp's cluster, each cluster's end, the clusters whose duration end[i] − end[i − 1] is measured
    (points 1, 2 and 4 of the module docstring) and the gap threshold."""
    gaps = np.diff(stamps.time)
    pair = np.flatnonzero(stamps.seq[1:] == stamps.seq[:-1])  # stamp j and j + 1: consecutive tokens
    gaps = gaps[pair]
    if not (gaps > 0).any():
        raise UserError(f"{path}: no two tokens of a sequence at different times; allowed: a replay with "
                         "multi-token outputs")
    typical = float(np.median(gaps[gaps > 0]))
    threshold = GAP_FRACTION * typical
    order = np.lexsort((stamps.k, stamps.seq, stamps.time))
    cluster = np.empty(len(order), dtype=np.int64)
    cluster[order] = _clusters(stamps.time[order], stamps.seq[order], threshold)
    count = int(cluster.max()) + 1
    end = np.full(count, np.inf)
    np.minimum.at(end, cluster, stamps.time)
    first = np.flatnonzero(stamps.k == 0)
    last = np.append(first[1:], len(order)) - 1

    # Busy from the step after the one by whose end a sequence was in the server, to its last token's.
    known = np.minimum(sent + typical, end[cluster[first]])
    busy = _spans(count, np.searchsorted(end, known) + 1, cluster[last])
    at = pair[gaps < threshold]  # bursts
    before = np.where(stamps.k[at] > 0, cluster[np.maximum(at - 1, 0)] + 1,
                      np.searchsorted(end, sent[stamps.seq[at]]))
    burst = _spans(count, before, cluster[at + 1] + 1)
    decodes = np.zeros(count, dtype=bool)
    decodes[cluster[stamps.k > 0]] = True
    piece = _spans(count, cluster[pair] + 1, cluster[pair + 1] - 1) & decodes
    piece[1:] |= piece[:-1]  # the next one starts at a piece's end
    measured = busy & ~burst & ~piece
    measured[0] = False  # its start is unknown
    usable = np.flatnonzero(measured)
    usable = usable[end[usable] > end[usable - 1]]
    if len(usable) < MIN_STEPS:
        raise UserError(f"{path}: only {len(usable)} busy engine steps reconstructed (of {count} token clusters); "
                         f"allowed: at least {MIN_STEPS} (a longer or busier replay)")
    return cluster, end, usable, threshold


def _spans(count: int, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Which of `count` clusters lie in at least one span lo..hi (inclusive; empty where hi < lo)."""
    keep = lo <= hi
    marks = np.zeros(count + 2, dtype=np.int64)
    np.add.at(marks, np.minimum(lo[keep], count), 1)
    np.add.at(marks, np.minimum(hi[keep], count) + 1, -1)
    return np.cumsum(marks)[:count] > 0


def _rows(stamps: _Stamps, cluster: np.ndarray, table: pd.DataFrame, usable: np.ndarray) -> list[list[StepItem]]:
    """The rows of each usable step (point 3 of the module docstring)."""
    prompt, cached = table["prompt_tokens"].tolist(), table["cached_prompt_tokens"].tolist()
    row = table["request"].tolist()
    items: dict[int, list[StepItem]] = {c: [] for c in usable.tolist()}
    prefilled: set[tuple[int, int]] = set()
    for c, s, j in zip(cluster.tolist(), stamps.seq.tolist(), stamps.k.tolist(), strict=True):
        if c not in items:
            continue
        if j:
            items[c].append(StepItem(1, prompt[s] + j - 1, True))
        elif (c, row[s]) not in prefilled:
            prefilled.add((c, row[s]))
            hit = min(cached[s], prompt[s] - 1)  # a full hit still computes the last prompt token
            items[c].append(StepItem(prompt[s] - hit, hit, False))
    return [items[c] for c in usable.tolist()]


def _clusters(times: np.ndarray, seqs: np.ndarray, threshold: float) -> np.ndarray:
    """The cluster of each stamp (in time order): cut at a gap over `threshold`, and where a sequence repeats."""
    ids = np.empty(len(times), dtype=np.int64)
    gaps = np.diff(times, prepend=times[0])
    current, members = 0, {}  # sequence -> its stamp's index in the current cluster
    for j, s in enumerate(seqs.tolist()):
        if j and gaps[j] > threshold:
            current, members = current + 1, {}
        elif s in members:
            cut = members[s] + 1 + int(np.argmax(gaps[members[s] + 1:j + 1]))
            current += 1
            ids[cut:j] = current
            members = {int(seqs[i]): i for i in range(cut, j)}
        members[s] = j
        ids[j] = current
    return ids


def _identify(x: np.ndarray, t: np.ndarray) -> tuple[list[int], dict[str, str]]:
    """Greedy column selection in COEFFICIENTS order on the relative-error design (rows / t, unit columns): a
    column is kept when its residual after projecting out the kept ones is at least RANK_TOLERANCE."""
    a = x / t[:, None]
    norms = np.linalg.norm(a, axis=0)
    kept: list[int] = []
    basis = np.zeros((len(t), 0))
    why: dict[str, str] = {}
    for j, name in enumerate(COEFFICIENTS):
        if not np.abs(x[:, j]).max() > 0:
            why[name] = "0 in every busy step this replay shows"
            continue
        unit = a[:, j] / norms[j]
        residual = unit - basis @ (basis.T @ unit)
        residual -= basis @ (basis.T @ residual)  # twice: Gram–Schmidt keeps its orthogonality
        size = float(np.linalg.norm(residual))
        if size >= RANK_TOLERANCE:
            kept.append(j)
            basis = np.column_stack([basis, residual / size])
            continue
        beta = np.linalg.lstsq(a[:, kept] / norms[kept], unit, rcond=None)[0]
        names = [COEFFICIENTS[i] for i, b in zip(kept, beta, strict=True) if abs(b) > 1e-3 * np.abs(beta).max()]
        why[name] = f"(near) a linear combination of {', '.join(names)} in every busy step this replay shows"
    return kept, why


def kinds_of(steps: list) -> list[str]:
    return ["decode" if all(i.is_decode for i in s) else "prefill" if not any(i.is_decode for i in s) else "mixed"
            for s in steps]


def _warnings(endpoint: dict, cached: np.ndarray, coefficients: dict, kinds: list[str]) -> dict:
    """Server counters that say the reconstruction missed work, and prices the fit could not give (listed in the
    fit, printed by calibrate, not fatal)."""
    counters = {k: v for k, v in (endpoint.get("server_counters") or {}).items() if isinstance(v, int | float)}
    notes = []
    with_prefill = sum(kind != "decode" for kind in kinds)
    if not coefficients["prefill_tokens"] and not coefficients["prefill_attention"]:
        # a few prefill-bearing steps among hundreds of decodes read as outliers to the robust fit: prompts
        # would then cost nothing in the simulation (measured: TTFT 99% fast against llama-server)
        notes.append(f"prompt tokens are priced at 0: only {with_prefill} of {len(kinds)} busy steps carried a "
                     "prefill, too few for the robust fit; replay a trace with more (or longer) prompts")
    if counters.get("prefix_cache_hits", 0) > 0 and not cached.any():
        notes.append("the server counted prefix-cache hits but reported no cached tokens per request: prefill "
                     "is overstated by the tokens it reused")
    if counters.get("num_preemptions", 0) > 0:
        notes.append(f"the server preempted {counters['num_preemptions']:g} times: recomputes are invisible")
    return {"warnings": notes} if notes else {}
