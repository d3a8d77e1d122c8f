"""Small drivers for scheduler tests."""

from __future__ import annotations

from kvplan.engine.core import CacheConfig, Scheduler, SchedulerConfig


def make_scheduler(block_size: int = 4, num_blocks: int = 64, budget: int = 64, max_seqs: int = 16,
                   **cache_kwargs) -> Scheduler:
    sched_keys = {"enable_chunked_prefill", "policy", "preemption_mode", "victim_policy", "schedule",
                  "scheduler_reserve_full_isl"}
    sched_kwargs = {k: cache_kwargs.pop(k) for k in list(cache_kwargs) if k in sched_keys}
    cache_kwargs.setdefault("watermark", 0.0)
    cache_kwargs.setdefault("max_model_len", min(num_blocks * block_size, 4096))
    return Scheduler(CacheConfig(block_size=block_size, num_blocks=num_blocks, **cache_kwargs),
                     SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=max_seqs, **sched_kwargs))


def step(sched: Scheduler, token: int = 1):
    out = sched.schedule()
    sampled = [[token] * item.request.n if item.request.n > 1 and not item.request.forked else token
               for item in out.scheduled]
    return out, sched.update(out, sampled)


def run_to_completion(sched: Scheduler, max_steps: int = 10_000) -> list:
    finished = []
    for _ in range(max_steps):
        if not sched.has_unfinished():
            return finished
        finished.extend(step(sched)[1].finished)
    raise AssertionError("scheduler did not drain")
