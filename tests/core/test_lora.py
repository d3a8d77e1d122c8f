"""Multi-LoRA in the core: vLLM's max_loras admission rule, adapter-separated prefix keys and the adapter slots."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvplan.engine.core import CacheConfig, Scheduler, SchedulerConfig, make_request
from kvplan.engine.core.lora import LoraSlots, check_max_lora_rank, lora_skipped, max_cpu_loras_of
from kvplan.engine.core.request import attach_block_keys
from kvplan.errors import ConfigError
from tests.core.helpers import step


def _scheduler(max_loras: int, prefix: bool = False, **kw) -> Scheduler:
    return Scheduler(CacheConfig(block_size=4, num_blocks=64, max_model_len=64, watermark=0.0,
                                 enable_prefix_caching=prefix),
                     SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=16, max_loras=max_loras, **kw))


def _add(sched: Scheduler, rid: str, lora: int, max_tokens: int = 2, tokens: list[int] | None = None) -> None:
    sched.add_request(make_request(rid, max_tokens=max_tokens, prompt_token_ids=tokens or [1, 2, 3, 4, 5],
                                   lora_id=lora, lora_name=f"a{lora}" if lora else ""))


def _admitted(out) -> list[str]:
    return [item.request_id for item in out.scheduled if item.start_pos == 0]


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_a_request_whose_adapter_exceeds_max_loras_is_skipped_and_keeps_its_place(policy):
    # by hand, max_loras 1: r0 (adapter 1) runs; r1 (adapter 2) would make two adapters: skipped; r2 (adapter 1)
    # and r3 (base) behind it are admitted; r1 stays at the head and runs once adapter 1's requests are done
    sched = _scheduler(1, policy=policy)
    for rid, lora in (("r0", 1), ("r1", 2), ("r2", 1), ("r3", 0)):
        _add(sched, rid, lora)
    out, _ = step(sched)
    assert _admitted(out) == ["r0", "r2", "r3"]
    assert [r.request_id for r in sched.waiting] == ["r1"]
    _add(sched, "r4", 3)  # arrives behind r1: kept behind it
    out, update = step(sched)  # r0, r2 (and r3) finish their 2 tokens in this step
    assert _admitted(out) == [] and {r.request_id for r in update.finished} == {"r0", "r2", "r3"}
    assert [r.request_id for r in sched.waiting] == ["r1", "r4"]
    out, _ = step(sched)
    assert _admitted(out) == ["r1"]  # adapter 2 alone: r4's adapter 3 is skipped again
    assert [r.request_id for r in sched.waiting] == ["r4"]


def test_two_slots_admit_two_adapters_and_base_requests_never_count():
    sched = _scheduler(2)
    for rid, lora in (("r0", 1), ("b0", 0), ("r1", 2), ("r2", 3), ("b1", 0), ("r3", 2)):
        _add(sched, rid, lora)
    out, _ = step(sched)
    assert _admitted(out) == ["r0", "b0", "r1", "b1", "r3"]
    assert [r.request_id for r in sched.waiting] == ["r2"]


def test_the_rule_is_vllms_check():
    assert not lora_skipped(0, {1, 2}, 2)  # base
    assert not lora_skipped(1, {1, 2}, 2)  # already running
    assert lora_skipped(3, {1, 2}, 2)
    assert not lora_skipped(3, {1}, 2)


def test_prefix_blocks_are_shared_within_an_adapter_only():
    tokens = list(range(1, 17))
    keys = {}
    for rid, name in (("base", ""), ("base2", ""), ("a", "sql"), ("a2", "sql"), ("b", "chat")):
        request = make_request(rid, max_tokens=1, prompt_token_ids=tokens, lora_id=1 if name else 0,
                               lora_name=name)
        attach_block_keys(request, 4)
        keys[rid] = [request.block_keys.key(i) for i in range(4)]
    assert keys["base"] == keys["base2"] and keys["a"] == keys["a2"]
    assert not set(keys["base"]) & set(keys["a"]) and not set(keys["a"]) & set(keys["b"])
    # the trace's kind of keys (prefix hashes, the simulator) likewise
    hashed = {}
    for name in ("", "sql", "chat", "sql"):
        request = make_request("h" + name, max_tokens=1, prompt_len=16, prefix_hashes=[7, 8], hash_granularity=8,
                               lora_name=name, lora_id=1 if name else 0)
        attach_block_keys(request, 4)
        hashed.setdefault(name, []).append([request.block_keys.key(i) for i in range(4)])
    assert hashed["sql"][0] == hashed["sql"][1]
    assert not set(hashed[""][0]) & set(hashed["sql"][0]) and not set(hashed["sql"][0]) & set(hashed["chat"][0])


def test_a_cached_prompt_hits_only_for_its_own_adapter():
    sched = _scheduler(4, prefix=True)
    prompt = list(range(1, 18))
    _add(sched, "first", 1, tokens=prompt)
    step(sched)
    _add(sched, "other", 2, tokens=prompt)
    _add(sched, "same", 1, tokens=prompt)
    out, _ = step(sched)
    cached = {item.request_id: item.num_cached_tokens for item in out.scheduled if item.start_pos <= 16}
    assert cached == {"other": 0, "same": 16}


def test_config_checks():
    assert max_cpu_loras_of(2, None) == 2 and max_cpu_loras_of(2, 5) == 5
    with pytest.raises(ConfigError, match="max_cpu_loras: 1 is below max_loras 2"):
        max_cpu_loras_of(2, 1)
    check_max_lora_rank(16)
    with pytest.raises(ConfigError, match="max_lora_rank: 12 is not a rank vLLM serves; allowed: 1, 8, 16"):
        check_max_lora_rank(12)


class BruteForceLRU:
    """The slot policy restated with use times: the resident with the oldest last use leaves first; a new device
    resident takes the lowest free slot."""

    def __init__(self, slots: int, cpu: int) -> None:
        self.slots, self.cpu = slots, cpu
        self.cpu_used: dict[int, int] = {}  # adapter -> last use
        self.gpu_used: dict[int, int] = {}
        self.slot: dict[int, int] = {}
        self.clock = 0

    def activate(self, ids: list[int]) -> tuple[dict[int, int], list[int], list[int]]:
        disk, gpu = [], []
        for a in ids:
            self.clock += 1
            if a not in self.cpu_used:
                if len(self.cpu_used) == self.cpu:
                    old = min(self.cpu_used, key=self.cpu_used.__getitem__)
                    del self.cpu_used[old]
                    self.gpu_used.pop(old, None)
                    self.slot.pop(old, None)
                disk.append(a)
            self.cpu_used[a] = self.clock
            if a not in self.gpu_used:
                if len(self.gpu_used) == self.slots:
                    old = min(self.gpu_used, key=self.gpu_used.__getitem__)
                    del self.gpu_used[old]
                    del self.slot[old]
                self.slot[a] = min(set(range(self.slots)) - set(self.slot.values()))
                gpu.append(a)
            self.gpu_used[a] = self.clock
        return {a: self.slot[a] for a in ids}, disk, gpu


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 4), st.integers(0, 4), st.lists(st.lists(st.integers(1, 9), max_size=4), max_size=30))
def test_the_slots_are_an_lru_as_a_brute_force_model_says(max_loras, extra_cpu, steps):
    slots, model = LoraSlots(max_loras, max_loras + extra_cpu), BruteForceLRU(max_loras, max_loras + extra_cpu)
    for ids in steps:
        ids = list(dict.fromkeys(ids))[:max_loras]  # admission keeps a step within max_loras distinct adapters
        got = slots.activate(ids)
        assert (got.slots, got.disk_loads, got.gpu_loads) == model.activate(ids)
        assert set(slots.lru_gpu) <= set(slots.lru_cpu) and len(slots.lru_cpu) <= max_loras + extra_cpu


def test_more_adapters_than_slots_in_one_step_is_a_bug():
    with pytest.raises(RuntimeError, match="exceed the 1 device slots"):
        LoraSlots(1, 2).activate([1, 2])
