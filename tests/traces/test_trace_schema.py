"""The columnar representation: flat arrays, no per-request or per-token Python objects."""

from __future__ import annotations

import types

import numpy as np

from kvplan import traces
from tests.traces.trace_fixtures import jsonl_text, write_text
from kvplan.traces import transforms as tf
from kvplan.traces.schema import ARRAY_FIELDS, Trace


def _assert_columnar(trace: Trace, hashes: int) -> None:
    n = len(trace)
    for name, values in trace.arrays().items():
        assert isinstance(values, np.ndarray) and values.ndim == 1, name
        assert values.dtype.kind in "if", f"{name} holds Python objects ({values.dtype})"
        assert len(values) == {"hash_ids": hashes, "hash_offsets": n + 1}.get(name, n), name
    assert set(trace.arrays()) == set(ARRAY_FIELDS)
    # Eight 8-byte columns per request plus 8 bytes per hash id and per offset: nothing else.
    assert trace.memory_bytes() == 8 * (8 * n + hashes + n + 1)


def test_a_large_loaded_trace_is_flat_arrays(tmp_path):
    n, per = 20_000, 12
    rng = np.random.default_rng(0)
    rows = [{"timestamp": 3 * i, "input_length": 512 * per - 7, "output_length": int(rng.integers(1, 500)),
             "hash_ids": [int(h) for h in rng.integers(0, 5000, per)]} for i in range(n)]
    trace = traces.load(write_text(tmp_path, "big.jsonl", jsonl_text(rows)))
    _assert_columnar(trace, n * per)
    # Extrapolated to a million such requests: about 170 MB, no per-token storage at all.
    assert trace.memory_bytes() / n * 1_000_000 < 200e6
    for derived in (tf.sample(trace, 0.5, 0), tf.expand_granularity(tf.window(trace, 0, 300), 128),
                    tf.jitter(trace, 3.0, 1)):
        _assert_columnar(derived, len(derived.hash_ids))
    assert isinstance(trace.records(), types.GeneratorType)  # records are built one at a time, on demand
    first = next(trace.records())
    assert first.prompt_token_ids is None and len(first.prefix_hashes) == per
