"""TPOT vs the number of speculative tokens k at one load: docs/speculative-decoding.md's table.

The same traffic as experiments/spec_decode.yaml (the bundled chat sample, Llama-3-8B on one H100, n-gram drafts,
acceptance 0.5 and 0.8) re-timed to one Poisson rate, simulated once per (k, acceptance), printed as a table:

    PYTHONPATH=. python scripts/spec_decode_tpot.py [--rate 10]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kvplan import traces
from kvplan.output import format_table
from kvplan.sim.run import simulate
from kvplan.sim.spec import SimSpec
from kvplan.traces.transforms import retime

ROOT = Path(__file__).resolve().parent.parent
KS = (1, 2, 4, 6)
RATES = (0.5, 0.8)
HEADERS = ("speculation", "req/s", "median_tpot_ms", "p90_tpot_ms", "median_ttft_ms", "tokens/verification")


def row(trace, config: str | None, label: str) -> list[str]:
    result = simulate(trace, SimSpec(model="llama-3-8b", hardware="h100-sxm", speculative_config=config))
    s, spec = result.summary, result.info.get("speculative")
    per_step = f"{spec['mean_acceptance_length']:.2f}" if spec else "1"
    return [label, f"{s['request_throughput']:.2f}", f"{s['median_tpot_ms']:.2f}", f"{s['p90_tpot_ms']:.2f}",
            f"{s['median_ttft_ms']:.1f}", per_step]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=10.0, help="requests per second (default 10)")
    args = parser.parse_args()
    chat = traces.load(str(ROOT / "traces" / "samples" / "chat.jsonl"))
    trace = retime(chat, {"process": "poisson", "rate": args.rate}, 0)
    rows = [row(trace, None, "none")]
    for rate in RATES:
        for k in KS:
            config = json.dumps({"method": "ngram", "num_speculative_tokens": k, "acceptance_rate": rate})
            rows.append(row(trace, config, f"ngram k={k} acceptance_rate={rate}"))
    print(f"sample:chat at {args.rate:g} req/s (Poisson, seed 0), llama-3-8b on h100-sxm, vLLM 0.34 defaults")
    print(format_table(HEADERS, rows))


if __name__ == "__main__":
    main()
