"""kvplan's core against vLLM's own V1 scheduler, step for step (see `tests/core/vllm_parity.py`).

Without vLLM the comparison is skipped with the reason; `scripts/vllm_parity.sh` builds a separate environment
with vLLM's wheel and runs it. `KVPLAN_PARITY_SCENARIOS` (default 20) sets how many seeded scenarios,
`KVPLAN_PARITY_FIRST_SEED` (default 0) the first seed; the summary line is printed (run with -s to see it). The
same seeds run twice: on a model of full-attention layers only, and on a hybrid one (sliding-window groups beside
a full-attention group, `make_hybrid_scenario`); and once with P/D requests (`vllm_parity_remote`: vLLM's
scheduler with a pull connector).
"""

from __future__ import annotations

import itertools
import os

import pytest

from kvplan.engine.core.vllm_versions import since
from tests.core.vllm_parity import (
    KvplanSide,
    Tally,
    VllmSide,
    describe,
    first_difference,
    kvplan_finishes_everything,
    make_cache_aware_scenario,
    make_hybrid_scenario,
    make_scenario,
    make_unchunked_scenario,
    run_side,
    vllm_minor,
    vllm_version,
)


def _seeds() -> range:
    count = int(os.environ.get("KVPLAN_PARITY_SCENARIOS", "20"))
    first = int(os.environ.get("KVPLAN_PARITY_FIRST_SEED", "0"))
    return range(first, first + count)


class CountingSide(KvplanSide):
    """kvplan's side, also counting admissions whose hit exceeds what the cache held before the step (blocks
    computed in the same step) and admissions whose prompt is chunked."""

    def __init__(self, scenario) -> None:
        super().__init__(scenario)
        self.same_step_hits = self.chunked = 0

    def step(self):
        sched = self.sched
        before = {r.request_id: (len(sched.kv.find_cached_prefix(r)) * sched.block_size, r.num_tokens)
                  for r in sched.waiting}
        record = super().step()
        for rid, hit in record.hits.items():
            self.same_step_hits += hit > before[rid][0]
            self.chunked += hit + record.scheduled[rid] < before[rid][1]
        return record


def test_scenarios_are_seeded_and_exercise_what_parity_is_about():
    """The generator alone (no vLLM): the same seed gives the same scenario, kvplan finishes every request, and
    a batch of scenarios preempts, hits the prefix cache, chunks prefills and admits requests that hit blocks
    computed in the same step - so an identical comparison means something."""
    assert make_scenario(7) == make_scenario(7) and make_scenario(7) != make_scenario(8)
    tally, same_step_hits, chunked = Tally(), 0, 0
    for seed in range(12):
        scenario = make_scenario(seed)
        side = CountingSide(scenario)
        records = run_side(side, scenario)
        assert kvplan_finishes_everything(records, scenario), describe(scenario)
        tally.add(records)
        same_step_hits += side.same_step_hits
        chunked += side.chunked
    assert tally.scenarios_preempting >= 2 and tally.scenarios_hitting >= 4, tally.line()
    assert same_step_hits and chunked, (same_step_hits, chunked)


def test_hybrid_scenarios_exercise_the_sliding_groups():
    """The hybrid generator alone: kvplan finishes every request, and the batch preempts and hits."""
    tally = Tally()
    for seed in range(8):
        scenario = make_hybrid_scenario(seed)
        records = run_side(KvplanSide(scenario), scenario)
        assert kvplan_finishes_everything(records, scenario), describe(scenario)
        tally.add(records)
    assert tally.scenarios_preempting >= 1 and tally.scenarios_hitting >= 4, tally.line()


def test_cache_aware_scenarios_reorder_admissions():
    """The cache-aware generator alone (no vLLM): with the window on, a good part of the scenarios schedule
    differently from the same scenario in arrival order - so an identical comparison means something."""
    differ = 0
    for seed in range(16):
        scenario = make_cache_aware_scenario(seed)
        ours = run_side(KvplanSide(scenario), scenario)
        assert kvplan_finishes_everything(ours, scenario), describe(scenario)
        scenario.cache_aware_window = 0
        differ += first_difference(ours, run_side(KvplanSide(scenario), scenario)) is not None
    assert differ >= 4, differ


def test_unchunked_long_prefill_differs_between_versions():
    """Without chunked prefill the long-prefill cap splits prompts under 0.33 and not under 0.34."""
    differ = sum(first_difference(run_side(KvplanSide(s, "0.33"), s), run_side(KvplanSide(s, "0.34"), s)) is not None
                 for s in map(make_unchunked_scenario, range(12)))
    assert differ >= 6, differ


def test_scenarios_identical_to_vllm():
    compare_with_vllm(make_scenario, "")


def test_hybrid_scenarios_identical_to_vllm():
    """Sliding-window and full-attention groups: kvplan's hybrid allocator against vLLM's
    `HybridKVCacheCoordinator` (its dense prefix-cache retention)."""
    compare_with_vllm(make_hybrid_scenario, "hybrid ")


def test_cache_aware_scenarios_identical_to_vllm():
    """vLLM 0.34's cache-aware admission (window 2-64, usage threshold 0 and 0.5)."""
    pytest.importorskip("vllm", reason="vLLM is not installed here; scripts/vllm_parity.sh builds an environment "
                                       "with its wheel and runs this comparison")
    if vllm_minor() not in since("0.34"):
        pytest.skip(f"vLLM {vllm_version()} has no cache-aware admission (added in 0.34)")
    compare_with_vllm(make_cache_aware_scenario, "cache-aware ")


def test_unchunked_scenarios_identical_to_vllm():
    """Chunked prefill off with a long-prefill threshold (the rule 0.34 changed)."""
    compare_with_vllm(make_unchunked_scenario, "unchunked long-prefill ")


def test_remote_scenarios_exercise_loads_and_held_blocks():
    """The P/D generator alone (no vLLM): kvplan finishes every request, loads park and wait, sends hold blocks,
    and holders are refused at times (so the remote comparison means something)."""
    from tests.core.vllm_parity_remote import KvplanRemoteSide, make_remote_scenario, run_remote

    parked = held = waited = 0
    for seed in range(10):
        remote = make_remote_scenario(seed)
        side = KvplanRemoteSide(remote)
        records = run_remote(side, remote)
        finished = sorted(rid for r in records for rid in r.step.finished)
        assert finished == sorted(a.request_id for a in remote.base.arrivals), seed
        parked += sum(1 for r in records if r.holding)
        held += sum(1 for rid in remote.role.values() if rid == "send")
        waited += sum(1 for a, b in itertools.pairwise(records) if set(a.holding) & set(b.holding))
    assert parked >= 20 and held >= 10 and waited >= 10, (parked, held, waited)


def test_remote_scenarios_identical_to_vllm():
    """P/D: decode-side requests loading their prompt's KV (WAITING_FOR_REMOTE_KVS) and prefill-side requests
    holding their blocks, against vLLM's scheduler with `ParityConnector` (NIXL's scheduler-side rules)."""
    pytest.importorskip("vllm", reason="vLLM is not installed here; scripts/vllm_parity.sh builds an environment "
                                       "with its wheel and runs this comparison")
    if vllm_minor() not in since("0.34"):
        pytest.skip(f"vLLM {vllm_version()}: kvplan's remote-KV admission follows 0.34's")
    from tests.core.vllm_parity_remote import (
        KvplanRemoteSide,
        VllmRemoteSide,
        make_remote_scenario,
        remote_difference,
        run_remote,
    )

    tally, failures = Tally(), []
    seeds = _seeds()
    for seed in seeds:
        ours = run_remote(KvplanRemoteSide(make_remote_scenario(seed)), make_remote_scenario(seed))
        remote = make_remote_scenario(seed)
        theirs = run_remote(VllmRemoteSide(remote), remote)
        difference = remote_difference(ours, theirs)
        if difference is not None:
            failures.append(f"{describe(remote.base)}\n    {difference}")
        else:
            tally.add([r.step for r in ours])
    report_line(f"{len(seeds)} P/D remote-KV scenarios", seeds, failures, tally)


def report_line(what: str, seeds: range, failures: list[str], tally: Tally) -> None:
    verdict = "identical" if not failures else f"{len(failures)} differ"
    line = f"vLLM {vllm_version()}: {what} (seeds {seeds.start}-{seeds.stop - 1}), {verdict}; identical ones: " \
           f"{tally.line()}"
    print(f"\nparity: {line}")
    report = os.environ.get("KVPLAN_PARITY_REPORT")
    if report:
        with open(report, "a") as f:  # every comparison's line
            f.write(line + "\n" + "\n".join(failures) + ("\n" if failures else ""))
    assert not failures, f"{len(failures)} of {len(seeds)} scenarios differ from vLLM:\n" + "\n".join(failures[:5])


def compare_with_vllm(make, label: str) -> None:
    pytest.importorskip("vllm", reason="vLLM is not installed here; scripts/vllm_parity.sh builds an environment "
                                       "with its wheel and runs this comparison")
    tally, failures = Tally(), []
    seeds = _seeds()
    for seed in seeds:
        scenario = make(seed)
        ours = run_side(KvplanSide(scenario, vllm_minor()), scenario)
        theirs = run_side(VllmSide(scenario), scenario)
        difference = first_difference(ours, theirs)
        if difference is not None:
            failures.append(f"{describe(scenario)}\n    {difference}")
        else:
            tally.add(ours)
    report_line(f"{len(seeds)} {label}scenarios", seeds, failures, tally)
