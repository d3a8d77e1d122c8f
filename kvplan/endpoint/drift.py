"""The endpoint drift probe: how fast the server runs now, against how fast it ran when the profile was fitted.

A server on a shared machine does not keep one speed (on the 2-core VM these docs were measured on, two other
engineers' jobs made llama-server up to 2.4x slower than at calibration). The in-process speed probe
(kvplan.calibration.probe) runs a fixed workload on a fresh engine; a black box cannot be started fresh, so this
probe sends a fixed request pattern to the endpoint instead: PROBE_REQUESTS requests of PROBE_PROMPT prompt tokens
(seeded token ids, no shared prefix with each other or with any trace, so they neither hit nor warm the trace's
prefix cache) and PROBE_OUTPUT output tokens, all at once, PROBE_ROUNDS times in a row. The lengths are fixed;
the ids are drawn afresh for every probe (seeded by a nonce), so that no probe hits what an earlier one left in
a prefix cache; what a prompt costs does not depend on its ids:

    probe_s = the rounds' wall time, summed;    speed_factor = probe_s / the calibration-time probe_s

`kvplan replay --endpoint` probes before and after its replay and writes probe.json; `calibrate --from-replay`
stores that reference in the profile (meta.endpoint_probe_s); `validate --endpoint` probes before and after every
repeat, reports the factors beside the errors, and scales the profile by them for the probe-adjusted view, as the
in-process path does. 1.0: as fast as at calibration; 1.3: 30% slower.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kvplan.calibration.probe import SpeedProbe
from kvplan.endpoint.prompts import EndpointRequest
from kvplan.endpoint.servers import ServerAdapter

PROBE_REQUESTS = 4
PROBE_PROMPT = 64
PROBE_OUTPUT = 16
PROBE_ROUNDS = 2
PROBE_SEED = 7_919  # fixed: the pattern is the same at calibration and at validation, whatever --seed


@dataclass(slots=True)
class EndpointProbe:
    """One probe: the wall seconds of the pattern (every request completed, else `error`)."""

    seconds: float
    error: str | None = None

    def to_json(self) -> dict:
        return {"seconds": None if math.isnan(self.seconds) else round(self.seconds, 6), "error": self.error,
                "pattern": {"requests": PROBE_REQUESTS, "prompt_tokens": PROBE_PROMPT,
                            "output_tokens": PROBE_OUTPUT, "rounds": PROBE_ROUNDS}}


def probe_requests(vocab_size: int, nonce: int, to_text: Callable[[list[int]], str] | None = None,
                   ) -> list[EndpointRequest]:
    """The fixed pattern of one round: distinct random prompts (ids below min(vocab, 32000), above the
    special-token range) so that nothing is shared; as text through `to_text` where the replay sends text."""
    rng = np.random.default_rng([PROBE_SEED, nonce])
    high = max(200, min(vocab_size, 32_000))
    prompts = [rng.integers(100, high, PROBE_PROMPT).tolist() for _ in range(PROBE_REQUESTS)]
    return [EndpointRequest(i, 0.0, to_text(ids) if to_text else ids, PROBE_PROMPT, PROBE_OUTPUT)
            for i, ids in enumerate(prompts)]


def endpoint_probe(url: str, model: str | None, adapter: ServerAdapter, vocab_size: int,
                   to_text: Callable[[list[int]], str] | None = None, timeout_s: float = 120.0,
                   scrapes=None) -> EndpointProbe:
    """One probe; each of its requests has `timeout_s` (--timeout), as a replay's requests have; `scrapes`: the
    command's /metrics state (loadgen.Scrapes)."""
    from kvplan.endpoint.loadgen import LoadGenerator

    generator = LoadGenerator(url, model, temperature=0.0, seed=PROBE_SEED, timeout_s=timeout_s,
                              sample_interval_s=5.0, adapter=adapter, progress=lambda line: None, scrapes=scrapes)
    total = 0.0
    for _ in range(PROBE_ROUNDS):
        load = generator.run(probe_requests(vocab_size, time.time_ns(), to_text))
        failed = [o.error for o in load.outcomes if o.error is not None]
        if failed:
            return EndpointProbe(math.nan, f"{len(failed)} of {PROBE_REQUESTS} probe requests failed: {failed[0]}")
        total += max(o.finish_s for o in load.outcomes)  # from the sending (t = 0) to the last token
    return EndpointProbe(total)


def write_probe_file(path, probes: list[EndpointProbe]) -> None:
    """probe.json: the probes around one replay and their mean (null when one failed), which `calibrate
    --from-replay` keeps as the profile's reference."""
    from kvplan.output import json_text, write_atomic

    seconds = [p.seconds for p in probes if p.error is None]
    write_atomic(path, json_text({"probes": [p.to_json() for p in probes],
                                  "seconds": sum(seconds) / len(seconds) if probes and len(seconds) == len(probes)
                                  else None}))


def speed_factors(probes: list[EndpointProbe], reference_s: float | None) -> list[SpeedProbe]:
    """Each probe as the in-process path's SpeedProbe (measured ÷ reference), so that the validation's
    probe-adjusted view is the same code; [] when there is no reference or a probe failed."""
    if reference_s is None or not reference_s > 0 or any(p.error or math.isnan(p.seconds) for p in probes):
        return []
    return [SpeedProbe(p.seconds, reference_s, PROBE_REQUESTS * PROBE_ROUNDS) for p in probes]
