"""Property-based test: random operation sequences against the scheduler, with a shadow KV memory.

The shadow memory stores, for every physical slot, the identity of the KV a real model would have written
there: (position, hash of all tokens up to it). Applying the step's copies and swaps to it and then checking
that every scheduled request's visible positions hold exactly its own history verifies prefix hits, forks,
copy-on-write, swap, sink+window and the prefix tiers below the GPU (their demotions and promotions, replayed in the
runner's order) end to end - not just the bookkeeping.
"""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvplan.engine.core import CacheConfig, RequestStatus, Scheduler, SchedulerConfig, make_request
from kvplan.engine.core.eviction import EVICTION_POLICIES
from kvplan.engine.core.tier_transfers import GPU, copy_batches
from kvplan.engine.core.victims import VICTIM_POLICIES
from tests.core.invariants import check_all_free, check_scheduler

TEMPLATES = [[(7 * t + j) % 5 for j in range(300)] for t in range(3)]  # shared prompt prefixes


def kv_identity(tokens: list[int], pos: int) -> tuple[int, int]:
    return pos, hash(tuple(tokens[: pos + 1]))


class SchedulerMachine(RuleBasedStateMachine):
    @initialize(block_size=st.sampled_from([1, 16, 64]), policy=st.sampled_from(sorted(EVICTION_POLICIES)),
                mode=st.sampled_from(["recompute", "swap"]), victim=st.sampled_from(sorted(VICTIM_POLICIES)),
                queue=st.sampled_from(["fcfs", "priority"]), window=st.booleans(), chunk=st.booleans(),
                blocks_per_request=st.integers(2, 5), full_isl=st.booleans(),
                tiers=st.sampled_from([(0, 0), (0, 0), (3, 0), (12, 0), (2, 4)]))
    def setup(self, block_size, policy, mode, victim, queue, window, chunk, blocks_per_request, full_isl, tiers):
        self.bs = block_size
        scale = max(1, 16 // block_size)  # keep token counts comparable across block sizes
        self.max_prompt = 3 * block_size * scale if block_size < 64 else 150
        window_tokens = 2 * block_size if window else 0
        sink_tokens = block_size // 2 + 1 if window else 0
        need = -(-(self.max_prompt + 8) // block_size)
        num_blocks = max(need, blocks_per_request * need // 2)
        self.sched = Scheduler(
            CacheConfig(block_size=block_size, num_blocks=num_blocks,
                        num_cpu_blocks=num_blocks if mode == "swap" else 0, eviction_policy=policy,
                        max_model_len=self.max_prompt + 8, window_tokens=window_tokens, sink_tokens=sink_tokens,
                        watermark=0.0, kv_offloading_blocks=tiers[0], kv_disk_blocks=tiers[1]),
            SchedulerConfig(max_num_batched_tokens=max(self.max_prompt + 8, 24) if not chunk else 2 * block_size + 3,
                            max_num_seqs=6, enable_chunked_prefill=chunk, policy=queue, preemption_mode=mode,
                            victim_policy=victim, scheduler_reserve_full_isl=full_isl))
        self.gpu: dict[int, tuple[int, int]] = {}
        self.cpu: dict[int, tuple[int, int]] = {}
        self.pools = {GPU: self.gpu, "cpu": {}, "disk": {}}  # the tiers' slots (the swap pool is `cpu` above)
        self.counter = 0
        self.ended: list = []

    # -- rules ---------------------------------------------------------------------------------------------
    @rule(template=st.integers(0, 2), shared=st.floats(0, 1), suffix=st.integers(0, 40),
          max_tokens=st.integers(1, 6), n=st.sampled_from([1, 1, 1, 2, 3]), priority=st.integers(0, 2))
    def add(self, template, shared, suffix, max_tokens, n, priority):
        shared_len = int(shared * min(self.max_prompt, len(TEMPLATES[template])))
        tokens = TEMPLATES[template][:shared_len] + [(self.counter + j) % 11 for j in range(suffix)]
        tokens = tokens[: self.max_prompt] or [1]
        self.counter += 1
        request = make_request(f"r{self.counter}", prompt_token_ids=tokens, max_tokens=max_tokens, n=n,
                               priority=priority, arrival_s=float(self.counter))
        self.sched.add_request(request)

    @precondition(lambda self: self.sched.has_unfinished())
    @rule()
    def step(self):
        out = self.sched.schedule()
        self._apply_memory_ops(out)
        sampled = []
        same_step_hit = False
        for item in out.scheduled:
            request = item.request
            for pos in range(item.start_pos, item.start_pos + item.num_new_tokens):
                block = self.sched.kv.tables[request.request_id][pos // self.bs]
                if block.ref_cnt > 1:
                    # Only the step that computes a full block, keyed when it was scheduled, may write it while a
                    # request admitted later in the same step holds it as a prefix hit (vLLM's timing): the key
                    # fixes its contents, so every holder expects what is written (`_check_visible` reads it).
                    assert block.key is not None, "write into a shared partial block (copy-on-write violated)"
                    same_step_hit = True
                self.gpu[block.block_id * self.bs + pos % self.bs] = kv_identity(request.token_ids, pos)
        for item in out.scheduled:
            self._check_visible(item)
            token = [(hash((item.request_id, item.request.num_output_tokens, j)) % 13) for j in range(item.request.n)]
            sampled.append(token if item.request.n > 1 and not item.request.forked else token[0])
        result = self.sched.update(out, sampled)
        self.ended.extend(result.finished)
        for name, happened in (("preempted", out.preempted), ("swap out", out.swap_out), ("swap in", out.swap_in),
                               ("copy-on-write", out.copies), ("window release", result.released),
                               ("prefix hit", any(i.num_cached_tokens for i in out.scheduled)),
                               ("eviction", self.sched.kv.pool.num_evictions), ("rejected", out.rejected),
                               ("n>1 fork", result.forked), ("same-step prefix hit", same_step_hit),
                               ("tier promotion", out.promotions), ("tier demotion", out.tier_transfers)):
            if happened:
                event(name)
        for rid, _ in out.rejected:
            assert rid not in self.sched.requests

    @precondition(lambda self: self.sched.requests)
    @rule(pick=st.integers(0, 10**6))
    def abort(self, pick):
        ids = sorted(self.sched.requests)
        assert self.sched.abort(ids[pick % len(ids)])

    @precondition(lambda self: self.sched.num_running_seqs < self.sched.config.max_num_seqs and any(
        (r.num_output_tokens > 0 and r.forked) or (r.n == 1 and r.num_output_tokens) for r in self.sched.running))
    @rule(pick=st.integers(0, 10**6))
    def fork(self, pick):
        parents = [r for r in self.sched.running if r.num_output_tokens > 0 and (r.n == 1 or r.forked)]
        parent = parents[pick % len(parents)]
        self.counter += 1
        child = self.sched.fork(parent, f"{parent.request_id}/f{self.counter}")
        assert child.token_ids == parent.token_ids and child.num_computed_tokens == parent.num_computed_tokens

    @rule()
    def drop_cache(self):
        self.sched.reset_prefix_cache()

    # -- checks --------------------------------------------------------------------------------------------
    def _apply_memory_ops(self, out):
        """In the runner's order (engine.core.outputs): swap-out, tier transfers, swap-in, copy-on-write."""
        tiers = [(self.pools[src], self.pools[dst], pairs) for src, dst, pairs in copy_batches(out.tier_transfers)]
        for memory_from, memory_to, pairs in ((self.gpu, self.cpu, out.swap_out), *tiers,
                                              (self.cpu, self.gpu, out.swap_in), (self.gpu, self.gpu, out.copies)):
            read = [[memory_from.get(src * self.bs + s) for s in range(self.bs)] for src, _ in pairs]
            for (_, dst), values in zip(pairs, read, strict=True):  # a batch reads before it writes
                for s, value in enumerate(values):
                    if value is None:
                        memory_to.pop(dst * self.bs + s, None)
                    else:
                        memory_to[dst * self.bs + s] = value

    def _check_visible(self, item):
        request, kv = item.request, self.sched.kv
        table = kv.tables[request.request_id]
        end = item.start_pos + item.num_new_tokens
        for i, block in enumerate(table):
            if block is None:
                continue
            for pos in range(i * self.bs, min((i + 1) * self.bs, end)):
                got = self.gpu.get(block.block_id * self.bs + pos % self.bs)
                assert got == kv_identity(request.token_ids, pos), f"{request.request_id} reads wrong KV at {pos}"

    @invariant()
    def consistent(self):
        if hasattr(self, "sched"):
            check_scheduler(self.sched)
            for request in self.sched.requests.values():
                if request.status is RequestStatus.RUNNING and request.num_computed_tokens:
                    assert request.num_cached_tokens < request.prompt_len, "a hit covered the last prompt token"

    def teardown(self):
        if not hasattr(self, "sched"):
            return
        for rid in list(self.sched.requests):
            self.sched.abort(rid)
        check_all_free(self.sched)
        for request in self.ended:
            assert request.num_output_tokens <= request.max_tokens


SchedulerMachine.TestCase.settings = settings(max_examples=1500, stateful_step_count=60, deadline=None,
                                              suppress_health_check=[HealthCheck.too_slow])
TestScheduler = pytest.mark.slow(SchedulerMachine.TestCase)
