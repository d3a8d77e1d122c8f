"""Validate the multi-LoRA simulator against the live engine: docs/lora.md's live-vs-simulated figures.

Writes N rank-R PEFT adapters for SmolLM2-135M (`calibration.lora.write_adapters`: seeded random weights on every
linear layer: q, k, v, o, gate, up, down - the timing and the policy do not depend on what an adapter learned),
spreads the sessions of docs/validation/spec-trace.jsonl over them (Zipf popularity,
`traces.transforms.assign_adapters`), and runs `kvplan validate` on that trace with fewer adapter slots than
adapters, so that requests wait for a slot and adapters are swapped in and out of the slots and the CPU cache
during the run:

    PYTHONPATH=. python scripts/lora_validation.py --out results/lora-validate

Everything it writes goes under --out (the adapters, the trace, the validation's result set); the validation's
report is its last output.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "lora-validate")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--trace", type=Path, default=ROOT / "docs" / "validation" / "spec-trace.jsonl")
    parser.add_argument("--adapters", type=int, default=4)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--skew", type=float, default=1.0)
    parser.add_argument("--max-loras", type=int, default=2)
    parser.add_argument("--max-cpu-loras", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    from kvplan import traces
    from kvplan.calibration.lora import write_adapters
    from kvplan.traces.io import render
    from kvplan.traces.transforms import assign_adapters

    work = args.out.parent / f".{args.out.name}.inputs"  # beside the result set, which validate replaces whole
    work.mkdir(parents=True, exist_ok=True)
    adapters = write_adapters(args.model, work / "adapters", args.adapters, args.rank)
    trace = assign_adapters(traces.load(str(args.trace)), args.adapters, args.skew, seed=0)
    trace_path = work / "lora-trace.jsonl"
    trace_path.write_bytes(render(trace, "jsonl"))
    command = [sys.executable, "-m", "kvplan", "validate", "--trace", str(trace_path), "--model", args.model,
               "--max-model-len", "1024", "--enable-lora", "--max-loras", str(args.max_loras), "--max-cpu-loras",
               str(args.max_cpu_loras), "--max-lora-rank", str(args.rank), "--repeats", str(args.repeats),
               "--out", str(args.out), "--lora-modules", *(f"{name}={path}" for name, path in adapters.items())]
    print(f"{args.adapters} rank-{args.rank} adapters over the sessions of {args.trace.name} (skew {args.skew:g}); "
          f"{args.max_loras} slots, {args.max_cpu_loras} in CPU memory", flush=True)
    return subprocess.run(command, cwd=ROOT, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
