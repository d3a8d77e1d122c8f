"""`kvplan bench core`: memory efficiency of paged allocation against reservation baselines, and the wall time
of one scheduler cycle."""

from __future__ import annotations

import statistics
import time

from kvplan.engine.core import CacheConfig, Scheduler, SchedulerConfig, make_request, memory_breakdown
from kvplan.bench.workloads import sharegpt_like

SATURATED_USAGE = 0.9  # a step counts as memory-bound when requests wait and this much KV memory is taken
CYCLE_BUDGET_S = 1e-3  # DESIGN.md: one schedule+update cycle with 256 running decodes <= 1 ms


def memory_efficiency(allocator: str, block_size: int, lengths: list[tuple[int, int]], num_slots: int,
                      max_model_len: int, sample_every: int = 4) -> dict[str, float]:
    """Replay the requests (all queued at t=0) to completion and average the memory breakdown over the
    saturated steps (requests waiting while at least 90% of the memory is taken), which is where the allocator
    decides capacity."""
    blocks = num_slots // block_size
    sched = Scheduler(CacheConfig(block_size=block_size, num_blocks=blocks, allocator=allocator,
                                  enable_prefix_caching=False, max_model_len=max_model_len, watermark=0.0),
                      SchedulerConfig(max_num_batched_tokens=4096, max_num_seqs=512))
    for i, (prompt, output) in enumerate(lengths):
        sched.add_request(make_request(f"r{i}", prompt_len=prompt, max_tokens=output))
    sums = dict.fromkeys(("token_states", "reserved_unused", "internal_fragmentation",
                          "external_fragmentation", "free"), 0.0)
    samples = batch = 0
    while sched.has_unfinished():
        step = sched.schedule()
        if step.step_id % sample_every == 0 and len(sched.waiting) and sched.kv.usage() >= SATURATED_USAGE:
            for key, value in memory_breakdown(sched.kv, sched.running).as_dict().items():
                sums[key] += value
            samples += 1
            batch += len(sched.running)
        sched.update(step)
    if not samples:
        raise ValueError(f"--requests: {len(lengths)} requests never filled the {num_slots} KV slots of the "
                         f"{allocator} allocator, so there is no saturated step to measure; use more requests")
    means = {k: v / samples for k, v in sums.items()}
    allocated = means["token_states"] + means["reserved_unused"] + means["internal_fragmentation"]
    means["kv_token_utilization"] = means["token_states"] / allocated
    means["mean_batch"] = batch / samples
    means["steps"] = sched.stats.num_steps
    means["preemptions"] = sched.stats.num_preemptions
    return means


def decode_cycle_time(num_running: int, block_size: int = 16, cycles: int = 200, prompt_len: int = 200,
                      with_tokens: bool = False, repeats: int = 5) -> float:
    """Wall time (s) of one schedule()+update() with `num_running` requests all in decode: the median over
    `repeats` runs of the mean over `cycles` cycles (robust to a busy machine)."""
    blocks = num_running * ((prompt_len + cycles + 64) // block_size + 2)
    sched = Scheduler(CacheConfig(block_size=block_size, num_blocks=blocks, enable_prefix_caching=True),
                      SchedulerConfig(max_num_batched_tokens=max(8192, num_running), max_num_seqs=num_running))
    for i in range(num_running):
        kwargs = ({"prompt_token_ids": [(i * 7 + j) % 1000 for j in range(prompt_len)]} if with_tokens
                  else {"prompt_len": prompt_len})
        sched.add_request(make_request(f"r{i}", max_tokens=cycles + 100, **kwargs))
    while any(r.num_output_tokens == 0 for r in sched.requests.values()):  # prefill everything first
        step = sched.schedule()
        sched.update(step, [1] * len(step.scheduled) if with_tokens else None)
    means = []
    per_repeat = cycles // repeats
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(per_repeat):
            step = sched.schedule()
            sched.update(step, [1] * len(step.scheduled) if with_tokens else None)
        means.append((time.perf_counter() - start) / per_repeat)
        if len(step.scheduled) != num_running:
            raise RuntimeError("benchmark setup: not every request decoded in the last cycle")
    return statistics.median(means)


def run(num_requests: int = 600, seed: int = 0) -> dict:
    lengths = sharegpt_like(num_requests, seed)
    max_len = 2048
    num_slots = 64 * 1024
    memory = {}
    for name, allocator, bs in (("paged_b16", "paged", 16), ("oracle", "oracle", 1), ("pow2", "pow2", 1),
                                ("max", "max", 1)):
        memory[name] = memory_efficiency(allocator, bs, lengths, num_slots, max_len)
    paged_util = memory["paged_b16"]["kv_token_utilization"]
    for result in memory.values():
        result["utilization_vs_paged"] = result["kv_token_utilization"] / paged_util
    cycles = {}
    for n in (256, 1024):
        seconds = decode_cycle_time(n)
        cycles[f"decode_cycle_{n}_ms"] = seconds * 1e3
        cycles[f"decode_cycle_{n}_vs_budget"] = seconds / CYCLE_BUDGET_S
    tokens = decode_cycle_time(256, with_tokens=True)
    cycles["decode_cycle_256_token_ids_ms"] = tokens * 1e3
    cycles["decode_cycle_256_token_ids_vs_budget"] = tokens / CYCLE_BUDGET_S
    mean_prompt = sum(p for p, _ in lengths) / len(lengths)
    mean_output = sum(o for _, o in lengths) / len(lengths)
    return {
        "workload": {"requests": num_requests, "seed": seed, "mean_prompt": mean_prompt,
                     "mean_output": mean_output, "max_len": max_len, "kv_slots": num_slots},
        "memory": memory,
        "cycle": cycles,
        "cycle_budget_ms": CYCLE_BUDGET_S * 1e3,
    }
