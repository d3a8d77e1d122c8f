"""Build the timing-validation trace from the Azure 2023 conversation trace (in ../shared/data; never committed).

A slice of the real arrivals (burstiness kept) stretched in time so that one CPU engine is 50-90% busy; the
real prompt and output lengths scaled to a small model's context; and a prefix-sharing workload on top: every
request starts with one of four system prompts (Zipf popularity), hashed at 32 tokens so that block sizes 8, 16
and 32 all see the same sharing.

    .venv/bin/python scripts/validation_trace.py --out /tmp/validation.jsonl
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from kvplan import traces
from kvplan.traces.io import render
from kvplan.traces.schema import Trace, offsets_from_counts
from kvplan.traces.transforms import scale_rate, window

AZURE = Path(__file__).resolve().parents[2] / "shared/data/azure-llm-2023/AzureLLMInferenceTrace_conv.csv"
GRANULARITY = 32
SYSTEM_PROMPT_BLOCKS = (2, 3, 4, 5)  # 64-160 tokens


def build(source: Path, start_s: float, span_s: float, stretch: float, length_scale: float, seed: int) -> Trace:
    azure = window(traces.load(source), start_s, start_s + span_s)
    azure = scale_rate(azure, 1.0 / stretch)
    rng = np.random.default_rng(seed)
    size = len(azure)
    popularity = 1.0 / np.arange(1, len(SYSTEM_PROMPT_BLOCKS) + 1)
    system = rng.choice(len(SYSTEM_PROMPT_BLOCKS), size=size, p=popularity / popularity.sum())
    blocks = np.array(SYSTEM_PROMPT_BLOCKS)[system]
    prompt = np.maximum(np.rint(azure.prompt_tokens * length_scale), 1).astype(np.int64) + blocks * GRANULARITY
    output = np.maximum(np.rint(azure.output_tokens * length_scale), 1).astype(np.int64)
    # System prompt k's j-th 32-token chunk has hash id 1000 k + j: shared exactly by the requests that use it.
    hash_ids = np.concatenate([1000 * k + np.arange(b) for k, b in zip(system, blocks, strict=True)])
    return Trace.build(azure.arrival_s, prompt, output, hash_ids=hash_ids, hash_offsets=offsets_from_counts(blocks),
                       hash_granularity=GRANULARITY)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source", type=Path, default=AZURE)
    p.add_argument("--start", type=float, default=1200.0, help="slice start in the Azure trace (s)")
    p.add_argument("--span", type=float, default=15.0, help="slice length in the Azure trace (s)")
    p.add_argument("--stretch", type=float, default=12.0, help="time stretch (12: 15 s of Azure -> 180 s)")
    p.add_argument("--length-scale", type=float, default=1 / 8, help="prompt/output length factor")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    if not args.source.is_file():
        raise SystemExit(f"{args.source}: the Azure conversation trace is not here (../shared/data); "
                         "pass --source PATH")
    trace = build(args.source, args.start, args.span, args.stretch, args.length_scale, args.seed)
    args.out.write_bytes(render(trace, "jsonl"))
    print(f"{args.out}: {len(trace)} requests over {trace.arrival_s[-1]:.0f} s; prompt mean "
          f"{trace.prompt_tokens.mean():.0f} (max {trace.prompt_tokens.max()}), output mean "
          f"{trace.output_tokens.mean():.0f} (max {trace.output_tokens.max()})")


if __name__ == "__main__":
    main()
