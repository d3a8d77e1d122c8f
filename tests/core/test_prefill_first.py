"""The prefill-first schedule (vLLM V0, the vLLM paper), worked out by hand beside the mixed one."""

from __future__ import annotations

import pytest

from kvplan.engine.core import ConfigError, SchedulerConfig, make_request
from tests.core.helpers import make_scheduler, run_to_completion, step


def batches(sched, steps: int) -> list[list[tuple[str, int]]]:
    return [[(i.request_id, i.num_new_tokens) for i in step(sched)[0].scheduled] for _ in range(steps)]


@pytest.mark.parametrize(("schedule", "third_step"), [("mixed", [("a", 1), ("b", 8)]),
                                                       ("prefill_first", [("b", 8)])])
def test_a_new_prompt_runs_alone_and_decodes_wait(schedule, third_step):
    sched = make_scheduler(block_size=4, budget=16, schedule=schedule)
    sched.add_request(make_request("a", prompt_len=6, max_tokens=4))
    assert batches(sched, 2) == [[("a", 6)], [("a", 1)]]
    sched.add_request(make_request("b", prompt_len=8, max_tokens=2))
    assert batches(sched, 2) == [third_step, [("a", 1), ("b", 1)]]


def test_chunking_off_takes_whole_prompts_up_to_the_budget():
    sched = make_scheduler(block_size=4, budget=16, schedule="prefill_first", enable_chunked_prefill=False)
    for rid in "cde":
        sched.add_request(make_request(rid, prompt_len=6, max_tokens=2))
    # c and d fill 12 of 16 tokens; e's 6 do not fit whole, so it waits for the next prefill step, which runs
    # before the decodes of c and d.
    assert batches(sched, 3) == [[("c", 6), ("d", 6)], [("e", 6)], [("c", 1), ("d", 1), ("e", 1)]]


def test_chunked_prompt_chunks_keep_priority_over_decodes():
    sched = make_scheduler(block_size=4, budget=16, schedule="prefill_first")
    for rid in "cde":
        sched.add_request(make_request(rid, prompt_len=6, max_tokens=2))
    # e gets the 4 tokens left; its last 2 run in a prefill step of their own, then everyone decodes.
    assert batches(sched, 3) == [[("c", 6), ("d", 6), ("e", 4)], [("e", 2)], [("c", 1), ("d", 1), ("e", 1)]]


def test_a_prefill_step_admits_at_most_max_num_seqs_sequences():
    sched = make_scheduler(block_size=4, budget=64, max_seqs=3, schedule="prefill_first")
    sched.add_request(make_request("g", prompt_len=4, max_tokens=2, n=2))
    sched.add_request(make_request("h", prompt_len=4, max_tokens=2))
    sched.add_request(make_request("i", prompt_len=4, max_tokens=2))
    first, second = batches(sched, 2)
    assert first == [("g", 4), ("h", 4)]  # g counts for 2 sequences: i would be the fourth
    assert sorted(second) == [("g", 1), ("g#1", 1), ("h", 1)]  # no prefill can be admitted: a decode step
    run_to_completion(sched)


def test_decodes_run_when_no_prefill_fits_in_memory():
    sched = make_scheduler(block_size=4, num_blocks=4, budget=64, max_model_len=16, schedule="prefill_first")
    sched.add_request(make_request("a", prompt_len=8, max_tokens=4))
    sched.add_request(make_request("b", prompt_len=9, max_tokens=2))  # 3 blocks: only 2 are left
    assert batches(sched, 3) == [[("a", 8)], [("a", 1)], [("a", 1)]]
    finished = run_to_completion(sched)
    assert sorted(r.request_id for r in finished) == ["a", "b"]


def test_schedule_names_are_checked():
    with pytest.raises(ConfigError) as error:
        SchedulerConfig(schedule="decode_first")
    assert str(error.value) == "scheduler.schedule: unknown value 'decode_first'; allowed: mixed, prefill_first"
