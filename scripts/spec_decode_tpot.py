"""TPOT vs the number of speculative tokens k at one load: docs/speculative-decoding.md's table.

The same traffic as experiments/spec_decode.yaml (the bundled chat sample, Llama-3-8B on one H100, n-gram drafts,
acceptance 0.5 and 0.8), one steady-state probe per (k, acceptance) at one sustained rate (`sim.probe`: 600 s of
arrivals drawn from the sample's sessions, warm-up and cool-down trimmed, with the probe's stability verdict),
printed as a table:

    PYTHONPATH=. python scripts/spec_decode_tpot.py [--rate 10]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kvplan import traces
from kvplan.output import format_table
from kvplan.sim.probe import Probe, run_probe
from kvplan.sim.spec import SimSpec
from kvplan.traces.steady import population

ROOT = Path(__file__).resolve().parent.parent
KS = (1, 2, 4, 6)
RATES = (0.5, 0.8)
HEADERS = ("speculation", "req/s", "median_tpot_ms", "p90_tpot_ms", "median_ttft_ms", "tokens/verification",
           "verdict")


def row(pop, rate: float, config: str | None, label: str) -> list[str]:
    spec = SimSpec(model="llama-3-8b", hardware="h100-sxm", speculative_config=config)
    result = run_probe(pop, spec, Probe(rate=rate), seed=0)
    s, drafts = result.summary, result.info.get("speculative")
    per_step = f"{drafts['mean_acceptance_length']:.2f}" if drafts else "1"
    return [label, f"{s['request_throughput']:.2f}", f"{s['median_tpot_ms']:.2f}", f"{s['p90_tpot_ms']:.2f}",
            f"{s['median_ttft_ms']:.1f}", per_step, str(result.info["probe"]["verdict"])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=10.0, help="requests per second (default 10)")
    args = parser.parse_args()
    pop = population(traces.load(str(ROOT / "traces" / "samples" / "chat.jsonl")))
    rows = [row(pop, args.rate, None, "none")]
    for accept in RATES:
        for k in KS:
            config = json.dumps({"method": "ngram", "num_speculative_tokens": k, "acceptance_rate": accept})
            rows.append(row(pop, args.rate, config, f"ngram k={k} acceptance_rate={accept}"))
    print(f"sample:chat sustained at {args.rate:g} req/s (one steady-state probe each, seed 0), llama-3-8b on "
          "h100-sxm, vLLM 0.34 defaults")
    print(format_table(HEADERS, rows))


if __name__ == "__main__":
    main()
