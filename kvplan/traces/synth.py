"""Synthetic workloads from a small YAML spec, deterministic for a seed.

    seed: 7
    requests: 600
    arrivals: {process: gamma, rate: 2.0, cv: 2.0}    # arrivals of sessions (a single request is a session)
    lengths:
      prompt: {dist: lognormal, median: 300, sigma: 0.9, max: 4000}   # the new text each request adds
      output: {dist: uniform, min: 16, max: 400}
    prefix:                                           # optional: prefix identity as hash ids
      granularity: 16                                 # tokens per hash id
      system_prompts: {count: 8, tokens: {dist: fixed, value: 600}, zipf: 1.1}
      few_shot: {templates: 4, shots: 5, shot_tokens: {dist: fixed, value: 100}, fraction: 0.3, zipf: 1.0}
      conversations: {fraction: 0.5, turns: {dist: uniform, min: 2, max: 6}, think_s: 30}

A prompt is a list of segments: system prompt, few-shot template, then for turn j the previous turns'
messages and answers followed by the new message. Hash id i is a chained hash of the segment pieces inside
block i, so requests share exactly the blocks whose whole content prefix agrees, as on a real server; the ids
are then renumbered 0, 1, 2, ... in order of first appearance, as in Mooncake's remapped hash_ids.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from hashlib import blake2b
from pathlib import Path

import numpy as np

from kvplan.traces.arrivals import MAX_SECONDS, arrival_times
from kvplan.traces.distributions import Sampler, length_sampler
from kvplan.traces.schema import LoadReport, Trace, TraceFormatError, offsets_from_counts
from kvplan.traces.specs import check_keys, fraction, integer, number, read_yaml
from kvplan.traces.transforms import compact_hash_ids

TOP_KEYS = ("seed", "requests", "arrivals", "lengths", "prefix")
PREFIX_KEYS = ("granularity", "system_prompts", "few_shot", "conversations")
ROOT = 0x73796E7468  # "synth": the parent of block 0
SYSTEM, SHOT, MESSAGE, ANSWER = range(4)  # segment kinds

# Limits that keep a spec within a 24 GiB machine and minutes, checked before the expensive part. Measured: a
# request without prefixes holds ~0.4 KB while generating; with prefixes, each hash id ~130 bytes and ~3 µs,
# and each prompt segment is walked in Python once per request that repeats it.
MAX_REQUESTS = 10_000_000
MAX_HASH_IDS = 50_000_000
MAX_SEGMENTS = 50_000_000
MAX_TURNS = 1_000  # turns of one session: its last prompt repeats all earlier turns, so a session costs turns²
MAX_FAMILY = 10_000  # system prompts, few-shot templates
MAX_SHOTS = 1_000
MAX_GRANULARITY = 2**16
MAX_ZIPF = 10.0  # the k-th member's weight is k^-zipf: at 10 only the first few are ever chosen
MAX_SEED = 2**63 - 1
REQUESTS_WHY = "the generator holds every request in memory, ~0.4 KB each; 10M is ~4 GB"


@dataclass(slots=True)
class Shared:
    """A family of shared prefixes (system prompts or few-shot templates) with Zipf popularity."""

    lengths: np.ndarray
    popularity: np.ndarray
    fraction: float  # share of sessions that carry one

    def pick(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """Index per session, -1 for sessions without one."""
        chosen = rng.choice(len(self.lengths), size=size, p=self.popularity)
        return np.where(rng.random(size) < self.fraction, chosen, -1)


def load_spec(path: str | Path) -> dict:
    try:
        return check_keys(read_yaml(path, "SPEC"), TOP_KEYS, "spec")
    except TraceFormatError as exc:
        raise TraceFormatError(f"{path}: {exc}") from None


def synthesize_file(path: str | Path) -> Trace:
    spec = load_spec(path)
    try:
        trace = synthesize(spec, base_dir=Path(path).parent)
    except ValueError as exc:  # every spec error names its key path; the file goes in front
        raise TraceFormatError(f"{path}: {exc}") from None
    trace.report.source = str(path)
    return trace


def synthesize(spec: dict, base_dir: Path = Path()) -> Trace:
    """The trace a spec describes; `base_dir` resolves the paths of empirical length sources."""
    check_keys(spec, TOP_KEYS, "spec")
    seed = integer(spec, "seed", "spec", minimum=0, maximum=MAX_SEED, why="a 64-bit seed")
    count = integer(spec, "requests", "spec", maximum=MAX_REQUESTS, why=REQUESTS_WHY)
    lengths = check_keys(spec.get("lengths"), ("prompt", "output"), "lengths")
    prompt = length_sampler(lengths.get("prompt"), "lengths.prompt", base_dir, "prompt")
    output = length_sampler(lengths.get("output"), "lengths.output", base_dir, "output")
    prefix = check_keys(spec.get("prefix", {}), PREFIX_KEYS, "prefix")
    granularity = integer(prefix, "granularity", "prefix", default=16, maximum=MAX_GRANULARITY,
                          why="tokens per hash id") if prefix else 0
    rng = np.random.default_rng(seed)
    session, turn, arrival = _schedule(spec.get("arrivals"), prefix.get("conversations"), count, rng,
                                       base_dir)
    message, answer = prompt(rng, len(session)), output(rng, len(session))
    system = _system_prompts(prefix.get("system_prompts"), base_dir, rng)
    shots = _few_shot(prefix.get("few_shot"), base_dir, rng)
    sessions = int(session[-1]) + 1 if len(session) else 0
    picks = [(kind, family, family.pick(rng, sessions)) for kind, family in ((SYSTEM, system), (SHOT, shots))
             if family is not None]
    _check_size(session, turn, message, answer, picks, granularity)
    segments = _segments(session, turn, message, answer, picks)
    order = np.argsort(arrival, kind="stable")[:count]
    hashes = [block_hashes(segments[i], granularity) for i in order] if granularity else None
    prompt_tokens = [sum(s[-1] for s in segments[i]) for i in order]
    return compact_hash_ids(Trace.build(
        arrival[order] - arrival[order].min(), prompt_tokens, answer[order],
        session_id=session[order], turn=turn[order] + 1,
        hash_ids=None if hashes is None else [h for hs in hashes for h in hs],
        hash_offsets=None if hashes is None else offsets_from_counts(np.array([len(h) for h in hashes])),
        hash_granularity=granularity, report=LoadReport(format="synth"),
    ))


def _schedule(arrivals: object, conversations: object, count: int, rng: np.random.Generator,
              base_dir: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(session, turn from 0, arrival) of every turn of enough sessions to yield `count` requests.

    Sessions arrive by the arrival process; a session's next turn follows after an exponential think time.
    """
    turns, think_s = _conversations(conversations, base_dir)
    session_turns = turns(rng, count) if turns else np.ones(count, dtype=np.int64)
    sessions = int(np.searchsorted(np.cumsum(session_turns), count)) + 1
    session_turns = session_turns[:sessions]
    starts = arrival_times(arrivals, sessions, rng)
    session = np.repeat(np.arange(sessions), session_turns)
    turn = np.arange(len(session)) - np.repeat(offsets_from_counts(session_turns)[:-1], session_turns)
    gaps = rng.exponential(think_s, size=len(session)) if think_s else np.zeros(len(session))
    gaps[turn == 0] = 0.0
    return session, turn, starts[session] + _cumsum_by_group(gaps, session_turns)


def _conversations(spec: object, base_dir: Path) -> tuple[Sampler | None, float]:
    if spec is None:
        return None, 0.0
    path = "prefix.conversations"
    check_keys(spec, ("fraction", "turns", "think_s"), path)
    multi_turn = fraction(spec, path, 1.0)
    turns = length_sampler(spec.get("turns"), f"{path}.turns", base_dir, maximum=MAX_TURNS,
                           why="turns per session; a session's last prompt repeats all its turns")
    think_s = number(spec, "think_s", path, default=30.0, maximum=MAX_SECONDS, why="mean seconds between turns")
    return (lambda rng, size: np.where(rng.random(size) < multi_turn, turns(rng, size), 1)), think_s


def _system_prompts(spec: object, base_dir: Path, rng: np.random.Generator) -> Shared | None:
    if spec is None:
        return None
    path = "prefix.system_prompts"
    check_keys(spec, ("count", "tokens", "fraction", "zipf"), path)
    count = integer(spec, "count", path, maximum=MAX_FAMILY, why="distinct system prompts")
    lengths = length_sampler(spec.get("tokens"), f"{path}.tokens", base_dir)(rng, count)
    return _popular(spec, path, lengths, default_fraction=1.0)


def _few_shot(spec: object, base_dir: Path, rng: np.random.Generator) -> Shared | None:
    if spec is None:
        return None
    path = "prefix.few_shot"
    check_keys(spec, ("templates", "shots", "shot_tokens", "fraction", "zipf"), path)
    count = integer(spec, "templates", path, maximum=MAX_FAMILY, why="distinct templates")
    shots = integer(spec, "shots", path, maximum=MAX_SHOTS, why="examples per template")
    draw = length_sampler(spec.get("shot_tokens"), f"{path}.shot_tokens", base_dir)
    # A template is `shots` examples, each of its own length.
    lengths = draw(rng, count * shots).reshape(count, shots).sum(axis=1)
    return _popular(spec, path, lengths, default_fraction=0.5)


def _popular(spec: dict, path: str, lengths: np.ndarray, default_fraction: float) -> Shared:
    """A family with Zipf popularity: the k-th most popular member is chosen with weight 1 / k^zipf."""
    zipf = number(spec, "zipf", path, default=1.0, maximum=MAX_ZIPF, why="popularity skew; 1 is classic Zipf")
    weights = 1.0 / np.arange(1, len(lengths) + 1) ** zipf
    return Shared(lengths, weights / weights.sum(), fraction(spec, path, default_fraction))


Picks = list[tuple[int, Shared, np.ndarray]]  # (segment kind, family, member per session or -1)


def _check_size(session: np.ndarray, turn: np.ndarray, message: np.ndarray, answer: np.ndarray, picks: Picks,
                granularity: int) -> None:
    """Refuse, before the Python loops, a spec whose prompts would take GBs and minutes to build.

    The counts are those `_segments` and `block_hashes` will build (over every generated turn, a few past
    `requests` when the last session is cut): a request's prompt holds its session's shared prefixes, every
    earlier turn's message and answer, and its own message; it takes one hash id per started block.
    """
    sessions = int(session[-1]) + 1 if len(session) else 0
    prefix_tokens, prefix_segments = np.zeros(sessions, dtype=np.int64), np.zeros(sessions, dtype=np.int64)
    for _, family, member in picks:
        prefix_tokens += np.where(member >= 0, family.lengths[np.maximum(member, 0)], 0)
        prefix_segments += member >= 0
    segments = int(prefix_segments[session].sum() + (2 * turn + 1).sum())
    if segments > MAX_SEGMENTS:
        raise TraceFormatError(
            f"spec.requests: these sessions make {segments} prompt segments (each turn repeats every earlier "
            f"turn); allowed: at most {MAX_SEGMENTS}, as the generator walks each in Python: fewer requests or "
            "fewer turns (prefix.conversations.turns)")
    if not granularity:
        return
    turn_tokens = message + answer
    history = _cumsum_by_group(turn_tokens, np.bincount(session)) - turn_tokens
    prompt = prefix_tokens[session] + history + message
    hash_ids = int(np.ceil(prompt / granularity).sum())
    if hash_ids > MAX_HASH_IDS:
        raise TraceFormatError(
            f"spec.requests: these requests make {hash_ids} prefix hash ids (prompt tokens / prefix.granularity); "
            f"allowed: at most {MAX_HASH_IDS}, as each costs ~130 bytes and ~3 µs to build: fewer requests, "
            "shorter prompts or a larger prefix.granularity")


def _segments(session: np.ndarray, turn: np.ndarray, message: np.ndarray, answer: np.ndarray,
              picks: Picks) -> list[list[tuple[int, ...]]]:
    """Each request's prompt as segments (kind, id..., length); turn j holds turns < j and their answers."""
    out: list[list[tuple[int, ...]]] = []
    history: list[tuple[int, ...]] = []
    for i in range(len(session)):
        s = int(session[i])
        if turn[i] == 0:
            history = [(kind, int(p[s]), int(f.lengths[p[s]])) for kind, f, p in picks if p[s] >= 0]
        out.append([*history, (MESSAGE, s, int(turn[i]), int(message[i]))])
        history = [*out[-1], (ANSWER, s, int(turn[i]), int(answer[i]))]
    return out


def block_hashes(segments: list[tuple[int, ...]], granularity: int) -> list[int]:
    """Chained ids of the prompt's blocks (the last one may be partial, as in Mooncake's hash_ids)."""
    pieces: list[list[int]] = [[]]
    filled = 0
    for *key, length in segments:
        offset = 0
        while offset < length:
            take = min(length - offset, granularity - filled)
            pieces[-1] += [len(key), *key, offset, take]  # the key's length keeps encodings unambiguous
            offset, filled = offset + take, filled + take
            if filled == granularity:
                pieces.append([])
                filled = 0
    ids, parent = [], ROOT
    for piece in pieces if pieces[-1] else pieces[:-1]:
        digest = blake2b(array("q", [parent, *piece]).tobytes(), digest_size=8).digest()
        parent = int.from_bytes(digest, "little") >> 1
        ids.append(parent)
    return ids


def _cumsum_by_group(values: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Running sum of `values` restarting at each group of `counts` consecutive items."""
    total = np.cumsum(values)
    starts = offsets_from_counts(counts)[:-1]
    before = np.concatenate(([0.0], total))[starts]
    return total - np.repeat(before, counts)
