"""`kvplan bench sim`: how fast the simulator runs against the clock it simulates, and how far it scales.

Two workloads:

* the one-hour Azure LLM inference conversation trace (2023; 19,366 requests) from the shared data directory,
  on one replica of llama-3-8b on h100-sxm - simulated seconds per wall second (target >= 1000x). The trace
  carries no prefix identity, so prefix caching (which could only ever hit a preempted request's own blocks)
  is off, and the run says so;
* a seeded synthetic workload of a million requests (ShareGPT-like lengths, Poisson arrivals) on 16 replicas
  behind a round-robin router - wall time and the process's peak resident memory.
"""

from __future__ import annotations

import resource
import time
from pathlib import Path

import numpy as np

from kvplan.bench.workloads import lognormal_lengths

DATA_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data"
AZURE_CONV = Path("azure-llm-2023") / "AzureLLMInferenceTrace_conv.csv"
SPEEDUP_TARGET = 1000.0


def run(data_dir: Path = DATA_DIR, synthetic_requests: int = 1_000_000, replicas: int = 16,
        per_replica_rate: float = 6.0, seed: int = 0) -> dict:
    result = {"azure_conv": azure_conv(data_dir)}
    result["synthetic"] = synthetic(synthetic_requests, replicas, per_replica_rate, seed)
    result["peak_rss_mb"] = peak_rss_mb()
    return result


def azure_conv(data_dir: Path) -> dict:
    import traces
    from sim.run import SimSpec, simulate

    path = data_dir / AZURE_CONV
    if not path.is_file():
        return {"skipped": True, "reason": f"{path} not found: the Azure trace lives in the shared data directory "
                                           "(../shared/data beside the repository), which this checkout lacks"}
    trace = traces.load(path)
    spec = SimSpec(model="llama-3-8b", hardware="h100-sxm", replicas=1, enable_prefix_caching=False)
    start = time.perf_counter()
    out = simulate(trace, spec)
    wall = time.perf_counter() - start
    simulated = out.summary["duration_s"]
    return {"trace": str(path), "requests": len(trace), "model": spec.model, "hardware": spec.hardware,
            "replicas": 1, "prefix_caching": "off (the trace has no prefix hashes)",
            "simulated_s": simulated, "wall_s": wall, "speedup": simulated / wall, "target": SPEEDUP_TARGET,
            "target_met": simulated / wall >= SPEEDUP_TARGET, "steps": out.info["steps"],
            "fast_steps": out.info["fast_steps"], "summary": out.summary}


def synthetic_trace(count: int, rate: float, seed: int):
    """ShareGPT-like lengths (mean prompt ~161, output ~338, at most 2048 together), Poisson arrivals."""
    from traces import Trace

    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, count))
    prompts = lognormal_lengths(rng, count, 161, 1.0, 1, 2047)
    outputs = np.minimum(lognormal_lengths(rng, count, 338, 0.9, 1, 2048), 2048 - prompts)
    return Trace.build(arrivals, prompts, outputs)


def synthetic(count: int, replicas: int, per_replica_rate: float, seed: int) -> dict:
    from sim.run import SimSpec, simulate

    trace = synthetic_trace(count, per_replica_rate * replicas, seed)
    spec = SimSpec(model="llama-3-8b", hardware="h100-sxm", replicas=replicas, router="round_robin",
                   enable_prefix_caching=False)
    start = time.perf_counter()
    out = simulate(trace, spec)
    wall = time.perf_counter() - start
    return {"requests": count, "replicas": replicas, "router": spec.router, "arrival_rate": per_replica_rate * replicas,
            "simulated_s": out.summary["duration_s"], "wall_s": wall,
            "speedup": out.summary["duration_s"] / wall, "steps": out.info["steps"],
            "fast_steps": out.info["fast_steps"], "summary": out.summary}


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux reports KiB
