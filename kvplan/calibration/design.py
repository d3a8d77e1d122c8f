"""The designed set of engine steps `kvplan calibrate` measures, at one block size.

Phases (each run `repeats` times after an unrecorded warm-up; every step of every phase is a data point):

* prefill: one prompt alone at a time, at several chunk sizes, from position 0 and after a cached prefix;
* decode grid: batch size × context length, uniform contexts and a skewed spread (a quarter long, the rest
  short); the contexts share a cached prefix, so reaching a long context costs one prefill, not one per request;
* mixed: a decoding batch joined by a new prompt (decode and prefill chunks in one step);
* transfers: a small pool under swap preemption (swap-out/in) and parallel sampling (copy-on-write forks).

Token ids come from a seeded generator; outputs are forced with ignore_eos, so every run has the same shape.
Requests sample at `temperature` (a replay's default is 1.0): sampling a row at a temperature costs ~10x a greedy
argmax on CPU (2 ms against 0.2 ms for a 32k vocabulary), so a profile must be measured the way traffic samples.
A step's duration is the whole `step()` call on the driver's clock (recorded as start_s/end_s), the engine's
bookkeeping after the update included - what a replay's step-to-step time contains.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from kvplan.engine.llm import LLM
from kvplan.engine.profiler import StepProfiler
from kvplan.engine.sampling import SamplingParams

PREFILL_CHUNKS = (24, 96, 320)
CACHED_PREFIX = 256
DECODE_BATCHES = (1, 4, 12, 32)
DECODE_CONTEXTS = (64, 448)
DECODE_STEPS = 8
SWAP_POOL_TOKENS = 320  # the transfer phase's KV pool: four requests of 112 tokens cannot all stay resident


@dataclass(slots=True)
class Driver:
    """Runs requests on an engine until they finish, recording each step while `profiler` is set."""

    llm: LLM
    rng: np.random.Generator
    temperature: float = 1.0
    profiler: StepProfiler | None = None
    origin: float = field(default_factory=time.perf_counter)

    def tokens(self, count: int) -> list[int]:
        return self.rng.integers(0, self.llm.loaded.vocab_size, size=count).tolist()

    def add(self, prompt: list[int], max_tokens: int, n: int = 1) -> None:
        params = SamplingParams(temperature=self.temperature if n == 1 else max(self.temperature, 1.0),
                                max_tokens=max_tokens, n=n, ignore_eos=True, seed=int(self.rng.integers(1 << 30)))
        self.llm.add_request(prompt, params)

    def step(self) -> None:
        start = time.perf_counter() - self.origin
        self.llm.step()
        end = time.perf_counter() - self.origin
        if self.profiler is not None:
            trace = self.llm.last_step
            self.profiler.record(trace.output, self.llm.kv_cache.layout.block_size, trace.times_s, start_s=start,
                                 end_s=end)

    def drain(self) -> None:
        while self.llm.has_unfinished_requests():
            self.step()

    def until_decoding(self) -> None:
        """Step until every running request has finished its prompt (the next steps are pure decode)."""
        sched = self.llm.scheduler
        while sched.waiting or any(r.num_computed_tokens < r.prompt_len for r in sched.running):
            self.step()


def prefill_phase(d: Driver) -> None:
    for chunk in PREFILL_CHUNKS:
        d.add(d.tokens(chunk), 2)
        d.drain()
    prefix = d.tokens(CACHED_PREFIX)
    d.add(prefix, 2)
    d.drain()
    for chunk in PREFILL_CHUNKS[:2]:
        d.add(prefix + d.tokens(chunk), 2)
        d.drain()


def decode_phase(d: Driver) -> None:
    for context in DECODE_CONTEXTS:
        prefix = d.tokens(context - 8)
        d.add(prefix, 1)
        d.drain()  # cached: every batch below reads it from the prefix cache
        for batch in DECODE_BATCHES:
            skews = (False, True) if batch >= 4 and context > DECODE_CONTEXTS[0] else (False,)
            for skewed in skews:
                for i in range(batch):
                    short = skewed and i >= batch // 4  # skewed: a quarter at the long context, the rest short
                    base = prefix[:DECODE_CONTEXTS[0] - 8] if short else prefix
                    d.add(base + d.tokens(8), DECODE_STEPS)
                d.drain()


def mixed_phase(d: Driver) -> None:
    for _ in range(8):
        d.add(d.tokens(96), 24)
    d.until_decoding()
    for _ in range(3):
        d.step()
    d.add(d.tokens(200), 4)
    d.drain()


def transfer_phase(d: Driver) -> None:
    for _ in range(4):
        d.add(d.tokens(64), 48)
    d.drain()
    d.add(d.tokens(37), 12, n=3)  # the forks share a partial block: copy-on-write on the first write
    d.drain()


PHASES: dict[str, Callable[[Driver], None]] = {"prefill": prefill_phase, "decode": decode_phase,
                                               "mixed": mixed_phase, "transfers": transfer_phase}


def warm_up(d: Driver) -> None:
    """Not recorded: the first calls build kernels, pack weights and fill allocator caches."""
    for _ in range(4):
        d.add(d.tokens(48), 4)
    d.drain()


def run_phases(llm: LLM, phases: tuple[str, ...], profiler: StepProfiler, repeats: int, seed: int,
               temperature: float = 1.0) -> None:
    driver = Driver(llm, np.random.default_rng(seed), temperature)
    warm_up(driver)
    driver.profiler = profiler
    for name in phases:
        for _ in range(repeats):
            PHASES[name](driver)
