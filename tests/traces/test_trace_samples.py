"""The committed samples are exactly what their specs generate, and load in their declared layouts."""

from __future__ import annotations

import numpy as np
import pytest

from kvplan import traces
from kvplan.traces.io import render_layout
from kvplan.traces.sample_generator import SAMPLES, generate
from kvplan.traces.samples import SAMPLES_DIR as HERE
from kvplan.traces.synth import synthesize_file


def test_committed_samples_are_reproducible(tmp_path):
    for path in generate(tmp_path):
        assert path.read_bytes() == (HERE / path.name).read_bytes(), path.name


@pytest.mark.parametrize(("name", "fmt"), [
    ("chat.jsonl", "kvplan-jsonl"), ("mooncake_style.jsonl", "mooncake"), ("azure_style.csv", "azure")])
def test_samples_load_in_their_layout(name, fmt):
    trace = traces.load(HERE / name)
    original = synthesize_file(HERE / SAMPLES[name][0])
    assert trace.report.format == fmt and len(trace) == len(original)
    assert np.array_equal(trace.prompt_tokens, original.prompt_tokens)
    # Public layouts round timestamps (Mooncake to 1 ms, Azure to 100 ns).
    np.testing.assert_allclose(trace.arrival_s, original.arrival_s, atol=1e-3)
    if original.has_prefix:
        assert np.array_equal(trace.hash_ids, original.hash_ids)


def test_mooncake_layout_needs_512_token_hashes():
    with pytest.raises(ValueError, match="Mooncake layout holds 512-token hash_ids; this trace "
                                         "has granularity 16"):
        render_layout(synthesize_file(HERE / "chat.yaml"), "mooncake")
