"""Deterministic token ids for hash-only traces, so that the live engine sees exactly the trace's sharing.

The chunk of G tokens under hash id h is drawn from `default_rng([seed, h])`: two requests sharing their
first k hash ids share their first k*G tokens, and (with overwhelming probability) differ in the next
chunk. Tokens past the hashed span come from a generator keyed by the request id, so they are never shared.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from hashlib import blake2b

import numpy as np

from kvplan.errors import UserError
from kvplan.traces.schema import RequestRecord, Trace

TAIL_STREAM = 1  # extra seed word separating per-request tail streams from per-hash chunk streams


def prompt_token_ids(record: RequestRecord, vocab_size: int, seed: int, *, low: int = 0) -> list[int]:
    """Token ids in [low, vocab_size) for the record's prompt (ids below `low`: special tokens)."""
    if not 0 <= low < vocab_size:
        raise UserError(f"token range [{low}, {vocab_size}) is empty")
    g = record.hash_granularity
    hashes = record.prefix_hashes or ()
    length = record.prompt_tokens
    chunks = [np.random.default_rng([seed, h]).integers(low, vocab_size, size=g)
              for h in hashes[:-(-length // g) if g else 0]]
    covered = len(chunks) * g
    if covered < length:
        rng = np.random.default_rng([seed, TAIL_STREAM, _request_key(record.request_id)])
        chunks.append(rng.integers(low, vocab_size, size=length - covered))
    return np.concatenate(chunks)[:length].tolist()


def materialize(trace: Trace, vocab_size: int, seed: int, *, low: int = 0) -> Iterator[RequestRecord]:
    """The trace's records with `prompt_token_ids` filled in."""
    for record in trace.records():
        yield replace(record, prompt_token_ids=prompt_token_ids(record, vocab_size, seed, low=low))


def _request_key(request_id: str) -> int:
    return int.from_bytes(blake2b(request_id.encode(), digest_size=8).digest(), "little")
