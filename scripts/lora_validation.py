"""Validate the multi-LoRA simulator against the live engine: docs/lora.md's live-vs-simulated figures.

Writes N rank-R PEFT adapters for SmolLM2-135M (seeded random weights on every linear layer: q, k, v, o, gate, up,
down - the timing and the policy do not depend on what an adapter learned), spreads the sessions of
docs/validation/spec-trace.jsonl over them (Zipf popularity, `traces.transforms.assign_adapters`), and runs
`kvplan validate` on that trace with fewer adapter slots than adapters, so that requests wait for a slot and
adapters are swapped in and out of the slots and the CPU cache during the run:

    PYTHONPATH=. python scripts/lora_validation.py --out results/lora-validate

Everything it writes goes under --out (the adapters, the trace, the validation's result set); the validation's
report is its last output.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
MODULES = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
           "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}


def module_shapes(model: str) -> dict[str, tuple[int, int]]:
    """(in, out) features of each targeted linear layer of `model` (its sim spec, which follows its config)."""
    from kvplan.sim.specs.models import get_model

    m = get_model(model)
    q, kv = m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
    return {"q_proj": (m.hidden_size, q), "k_proj": (m.hidden_size, kv), "v_proj": (m.hidden_size, kv),
            "o_proj": (q, m.hidden_size), "gate_proj": (m.hidden_size, m.intermediate_size),
            "up_proj": (m.hidden_size, m.intermediate_size), "down_proj": (m.intermediate_size, m.hidden_size)}


def write_adapters(model: str, out: Path, count: int, rank: int) -> dict[str, str]:
    from kvplan.engine.lora import write_peft_adapter
    from kvplan.sim.specs.models import get_model

    layers, shapes = get_model(model).num_layers, module_shapes(model)
    adapters = {}
    for k in range(1, count + 1):
        g = torch.Generator().manual_seed(k)
        weights = {f"model.layers.{layer}.{MODULES[name]}.{name}":
                   (torch.randn(rank, n_in, generator=g) * 0.02, torch.randn(n_out, rank, generator=g) * 0.02)
                   for layer in range(layers) for name, (n_in, n_out) in shapes.items()}
        adapters[f"lora-{k}"] = str(write_peft_adapter(out / f"lora-{k}", weights, rank=rank, alpha=2.0 * rank))
    return adapters


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
