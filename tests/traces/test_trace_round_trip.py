"""Round trip (issue 3): any loaded trace, converted by `kvplan trace convert` to each of our formats, loads
again as identical records. Property test over generated traces in every layout the test writes: our JSONL,
CSV and Parquet (with and without prefix hashes, sessions, turns, priorities, n), Mooncake JSONL and Azure CSV.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvplan import traces
from kvplan.cli import main
from kvplan.traces.io import KINDS, render, render_layout
from kvplan.traces.schema import NO_VALUE, Trace
from tests.traces.trace_fixtures import write_jsonl

LAYOUTS = ("kvplan-jsonl", "kvplan-csv", "kvplan-parquet", "mooncake", "azure")
SMALL = st.integers(0, 2**31 - 1)  # numeric columns are parsed as float64: exact up to 2^53
HASH_ID = st.integers(0, 2**63 - 1)  # hash ids are read as int64: any value in range must survive


@st.composite
def requests(draw: st.DrawFn) -> list[dict]:
    """1-12 requests in arrival order, each with every column any layout might carry."""
    count = draw(st.integers(1, 12))
    gaps = draw(st.lists(st.integers(0, 5000), min_size=count, max_size=count))  # ms; 0 gives ties
    ids = draw(st.lists(SMALL, min_size=count, max_size=count, unique=True))
    optional = st.one_of(st.none(), st.integers(0, 1000))
    return [{
        "arrival_ms": int(t), "request_id": rid,
        "prompt_tokens": draw(st.integers(1, 40_000)), "output_tokens": draw(st.integers(0, 4000)),
        "session_id": draw(optional), "turn": draw(optional),
        "priority": draw(st.integers(-1000, 1000)), "n": draw(st.integers(1, 8)),
        "hashes": draw(st.lists(st.one_of(st.integers(0, 20), HASH_ID), max_size=6)),
    } for t, rid in zip(np.cumsum(gaps).tolist(), ids, strict=True)]


def _native_trace(reqs: list[dict], granularity: int, fraction_s: float) -> Trace:
    """Our columns from the generated requests (granularity 0: no prefix hashes)."""
    hashed = granularity > 0
    return Trace.build(
        [r["arrival_ms"] / 1000 + fraction_s for r in reqs], [r["prompt_tokens"] for r in reqs],
        [r["output_tokens"] for r in reqs], request_id=[r["request_id"] for r in reqs],
        session_id=[NO_VALUE if r["session_id"] is None else r["session_id"] for r in reqs],
        turn=[NO_VALUE if r["turn"] is None else r["turn"] for r in reqs],
        priority=[r["priority"] for r in reqs], n=[r["n"] for r in reqs],
        hash_ids=[h for r in reqs for h in r["hashes"]] if hashed else None,
        hash_offsets=np.cumsum([0, *(len(r["hashes"]) for r in reqs)]) if hashed else None,
        hash_granularity=granularity)


def _fit_prompts(reqs: list[dict], granularity: int, exact: bool) -> list[dict]:
    """Prompt lengths that hold their hashes: ceil(prompt / granularity) blocks, at least (or exactly) one per
    hash, as the loaders check."""
    out = []
    for r in reqs:
        k, p = len(r["hashes"]), r["prompt_tokens"]
        if granularity and k:
            p = (k - 1) * granularity + 1 + (p % granularity if exact else p)
        out.append({**r, "prompt_tokens": p})
    return out


def _write_source(folder: Path, layout: str, reqs: list[dict], granularity: int, fraction_s: float) -> Path:
    if layout == "mooncake":
        return write_jsonl(folder, "source.jsonl", [
            {"timestamp": r["arrival_ms"], "input_length": r["prompt_tokens"], "output_length": r["output_tokens"],
             "hash_ids": r["hashes"]} for r in reqs])
    if layout == "azure":
        trace = Trace.build([r["arrival_ms"] / 1000 + fraction_s for r in reqs],
                            [r["prompt_tokens"] for r in reqs], [r["output_tokens"] for r in reqs])
        path = folder / "source.csv"
        path.write_bytes(render_layout(trace, "azure"))
        return path
    kind = layout.removeprefix("kvplan-")
    path = folder / f"source.{kind}"
    path.write_bytes(render(_native_trace(reqs, granularity, fraction_s), kind))
    return path


def _convert(source: Path, out: Path) -> None:
    """The `kvplan trace convert` command itself, its summary output swallowed."""
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["trace", "convert", str(source), str(out), "--json"]) == 0


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS)
@settings(max_examples=25, deadline=None)
@given(reqs=requests(), granularity=st.sampled_from([0, 16, 512]), fraction_s=st.floats(0, 1, allow_nan=False))
def test_loaded_trace_survives_convert_to_every_format(layout, reqs, granularity, fraction_s):
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        reqs = _fit_prompts(reqs, 512 if layout == "mooncake" else granularity, exact=layout == "mooncake")
        source = _write_source(folder, layout, reqs, granularity, fraction_s)
        loaded = traces.load(source)
        assert loaded.report.format == layout and len(loaded) == len(reqs)
        expected = list(loaded.records())
        for kind in KINDS:
            out = folder / f"converted.{kind}"
            _convert(source, out)
            again = traces.load(out)
            assert again.report.format == f"kvplan-{kind}"
            assert list(again.records()) == expected, kind
            assert (again.hash_granularity, again.timed) == (loaded.hash_granularity, loaded.timed), kind
