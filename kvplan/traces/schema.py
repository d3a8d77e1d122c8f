"""The Request record and its columnar form, `Trace`.

`Trace` is the primary form: one numpy array per field, sorted by arrival. Prefix identity is a flat
`hash_ids` array with `hash_offsets` (request i owns `hash_ids[hash_offsets[i]:hash_offsets[i + 1]]`), so a
million requests cost a few arrays instead of a million Python lists. `RequestRecord` is the per-request view
the engine and the simulator build core requests from; `Trace.records()` yields them lazily.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import numpy as np

from kvplan.errors import SHOWN_CHARS, UserError, listed, short_repr  # noqa: F401 (re-exported)

NO_VALUE = -1  # session_id / turn when the source has none
MAX_ARRIVAL_S = 1e10  # ~300 years of trace: float64 seconds still resolve microseconds
ARRAY_FIELDS = ("arrival_s", "prompt_tokens", "output_tokens", "request_id", "session_id", "turn", "priority",
                "n", "hash_ids", "hash_offsets")


class TraceFormatError(UserError):
    """Bad input: the message names the file and line (or the YAML key) and what is allowed."""





@dataclass(slots=True)
class RequestRecord:
    request_id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    prefix_hashes: tuple[int, ...] | None = None  # one per `hash_granularity` prompt tokens
    hash_granularity: int = 0
    session_id: int | None = None
    turn: int | None = None
    priority: int = 0
    n: int = 1
    prompt_token_ids: list[int] | None = None
    lora: str | None = None  # the LoRA adapter it names (None: the base model)


@dataclass(slots=True)
class LoadReport:
    """What a load changed, so that nothing is dropped or reordered silently."""

    source: str = ""
    format: str = ""
    dropped_bad: int = 0
    bad_lines: list[int] = field(default_factory=list)  # the first few line numbers of dropped rows
    dropped_failed: int = 0  # BurstGPT: failed requests (0 response tokens)
    kept_failed: int = 0  # ... and those kept (--keep-failed): the simulator rejects them, counted
    reordered: int = 0  # rows that arrived out of order within the tolerance and were sorted
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = []
        if self.dropped_bad:
            shown = ", ".join(str(n) for n in self.bad_lines)
            out.append(f"dropped {self.dropped_bad} bad rows (--skip-bad), first at lines {shown}")
        if self.dropped_failed:
            out.append(f"dropped {self.dropped_failed} failed requests (0 output tokens; --keep-failed keeps them)")
        if self.kept_failed:
            out.append(f"kept {self.kept_failed} failed requests (0 output tokens, --keep-failed): they arrive but "
                       "are never served")
        if self.reordered:
            out.append(f"sorted {self.reordered} rows that arrived out of order within the tolerance")
        return out + self.notes


def _i64(values: object) -> np.ndarray:
    return np.ascontiguousarray(values, dtype=np.int64)


@dataclass(slots=True)
class Trace:
    arrival_s: np.ndarray  # float64, non-decreasing
    prompt_tokens: np.ndarray  # int64, >= 1; 0 only in a failed request (output 0) kept from the source
    output_tokens: np.ndarray  # int64, >= 0 (0: a failed request, which the simulator rejects, counted)
    request_id: np.ndarray  # int64, unique
    session_id: np.ndarray  # int64, NO_VALUE when unknown
    turn: np.ndarray  # int64, NO_VALUE when unknown
    priority: np.ndarray  # int64
    n: np.ndarray  # int64, parallel samples
    hash_ids: np.ndarray | None = None  # int64, flat; None: the trace carries no prefix identity
    hash_offsets: np.ndarray | None = None  # int64, len == len(self) + 1
    hash_granularity: int = 0
    timed: bool = True  # False for length-only sources (arrivals are all zero until re-timed)
    report: LoadReport = field(default_factory=LoadReport)
    # int64: the file line each request starts on (the line its errors name); None when not read from a file
    source_line: np.ndarray | None = None
    # int64: the LoRA adapter each request names, k > 0 for lora_names[k - 1], 0 the base model; None: no row
    # names one (the JSONL key `lora`)
    lora: np.ndarray | None = None
    lora_names: tuple[str, ...] = ()

    @classmethod
    def build(cls, arrival_s: object, prompt_tokens: object, output_tokens: object, *,
              request_id: object = None, session_id: object = None, turn: object = None,
              priority: object = None, n: object = None, hash_ids: object = None,
              hash_offsets: object = None, hash_granularity: int = 0, timed: bool = True,
              report: LoadReport | None = None, source_line: object = None, lora: object = None,
              lora_names: tuple[str, ...] = ()) -> Trace:
        """Arrays from any sequences, with defaults for the optional columns."""
        size = len(prompt_tokens)  # type: ignore[arg-type]

        def column(values: object, default: int) -> np.ndarray:
            return np.full(size, default, np.int64) if values is None else _i64(values)

        has_prefix = hash_ids is not None
        return cls(
            arrival_s=np.ascontiguousarray(arrival_s, dtype=np.float64),
            prompt_tokens=_i64(prompt_tokens), output_tokens=_i64(output_tokens),
            request_id=np.arange(size, dtype=np.int64) if request_id is None else _i64(request_id),
            session_id=column(session_id, NO_VALUE), turn=column(turn, NO_VALUE),
            priority=column(priority, 0), n=column(n, 1),
            hash_ids=_i64(hash_ids) if has_prefix else None,
            hash_offsets=_i64(hash_offsets) if has_prefix else None,
            hash_granularity=hash_granularity if has_prefix else 0, timed=timed,
            report=report or LoadReport(), source_line=None if source_line is None else _i64(source_line),
            lora=None if lora is None or not lora_names else _i64(lora), lora_names=tuple(lora_names),
        )

    def __len__(self) -> int:
        return len(self.prompt_tokens)

    def arrays(self) -> dict[str, np.ndarray]:
        """Every per-request or per-hash array of the trace, by field name."""
        return {name: getattr(self, name) for name in ARRAY_FIELDS if getattr(self, name) is not None}

    def memory_bytes(self) -> int:
        return sum(a.nbytes for a in self.arrays().values())

    @property
    def has_prefix(self) -> bool:
        return self.hash_ids is not None

    def hashes_of(self, i: int) -> np.ndarray:
        assert self.hash_ids is not None and self.hash_offsets is not None
        return self.hash_ids[self.hash_offsets[i]:self.hash_offsets[i + 1]]

    def hash_counts(self) -> np.ndarray:
        assert self.hash_offsets is not None
        return np.diff(self.hash_offsets)

    def take(self, index: np.ndarray) -> Trace:
        """The requests at `index` (an integer array or a boolean mask), in that order."""
        idx = np.flatnonzero(index) if np.asarray(index).dtype == bool else _i64(index)
        hash_ids = hash_offsets = None
        if self.has_prefix:
            hash_ids, hash_offsets = gather_segments(self.hash_ids, self.hash_offsets, idx)
        return replace(
            self, arrival_s=self.arrival_s[idx], prompt_tokens=self.prompt_tokens[idx],
            output_tokens=self.output_tokens[idx], request_id=self.request_id[idx],
            session_id=self.session_id[idx], turn=self.turn[idx], priority=self.priority[idx], n=self.n[idx],
            hash_ids=hash_ids, hash_offsets=hash_offsets,
            source_line=None if self.source_line is None else self.source_line[idx],
            lora=None if self.lora is None else self.lora[idx],
        )

    def reference(self, i: int) -> str:
        """How every report names request `i`: its request_id (the per-request table's key; the source row for
        files without ids) and the line of the file it came from, if any."""
        if self.source_line is None:
            return f"request_id {int(self.request_id[i])}"
        where = os.path.basename(self.report.source) or "line"
        return f"request_id {int(self.request_id[i])} ({where}:{int(self.source_line[i])})"

    def with_columns(self, **changes: object) -> Trace:
        return replace(self, **changes)

    @property
    def servable(self) -> np.ndarray:
        """Rows with something to serve: >= 1 prompt and >= 1 output token (a failed request has 0 of either)."""
        return (self.prompt_tokens >= 1) & (self.output_tokens >= 1)

    def records(self) -> Iterator[RequestRecord]:
        for i in range(len(self)):
            yield self.record(i)

    def record(self, i: int) -> RequestRecord:
        session, turn = int(self.session_id[i]), int(self.turn[i])
        prefix = tuple(int(h) for h in self.hashes_of(i)) if self.has_prefix else None
        return RequestRecord(
            request_id=str(int(self.request_id[i])), arrival_s=float(self.arrival_s[i]),
            prompt_tokens=int(self.prompt_tokens[i]), output_tokens=int(self.output_tokens[i]),
            prefix_hashes=prefix, hash_granularity=self.hash_granularity if prefix is not None else 0,
            session_id=None if session == NO_VALUE else session, turn=None if turn == NO_VALUE else turn,
            priority=int(self.priority[i]), n=int(self.n[i]), lora=self.lora_of(i),
        )

    def lora_of(self, i: int) -> str | None:
        """The adapter request `i` names (None: the base model)."""
        k = 0 if self.lora is None else int(self.lora[i])
        return self.lora_names[k - 1] if k else None


def gather_segments(flat: np.ndarray, offsets: np.ndarray, idx: np.ndarray,
                    keep: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Segments `idx` of a flat array with offsets, each cut to its first `keep[j]` items when given."""
    starts = offsets[idx]
    counts = offsets[idx + 1] - starts
    if keep is not None:
        counts = np.minimum(counts, keep)
    new_offsets = offsets_from_counts(counts)
    # Position of every kept item in the source: its segment's start plus its rank within the segment.
    within = np.arange(new_offsets[-1], dtype=np.int64) - np.repeat(new_offsets[:-1], counts)
    return flat[np.repeat(starts, counts) + within], new_offsets


def offsets_from_counts(counts: np.ndarray) -> np.ndarray:
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return offsets
