"""Step-by-step parity of kvplan's core with vLLM's own V1 scheduler, on seeded random scenarios.

Both schedulers get the same requests (token ids, so block hashes come from the tokens on both sides) at the same
steps, and after every `schedule()` the same fake model output, as vLLM's `tests/v1/core/` do: one sampled token
for every request whose scheduled chunk reaches its last token, nothing for a partial prefill chunk. Each step's
observable decisions are recorded as a `StepRecord` and compared:

* the tokens scheduled for each request,
* the prefix-cache hit (tokens) of each request admitted from the waiting queue,
* the preempted requests, the finished requests,
* the free blocks (empty plus cached-but-free) after the schedule and after the update,
* the order of the running list and of the waiting queue.

vLLM's pool has a null block (block 0) that is never handed out, so it gets one block more than kvplan.

Scenario generation and the kvplan side need only the standard library; the vLLM side imports vLLM (its wheel
installed without dependencies, a CPU torch and the few pure-Python packages its scheduler imports -
`scripts/vllm_parity.sh` builds that environment). vLLM needs a model config, read from a tiny Llama
`config.json` written to a temporary folder: no weights and no tokenizer are loaded.
"""

from __future__ import annotations

import json
import random
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from kvplan.engine.core import CacheConfig, Scheduler, SchedulerConfig, make_request
from kvplan.engine.core.config import HybridCacheConfig
from kvplan.engine.core.kv_layout import FULL, SLIDING, KVGroup, KVLayout
from kvplan.engine.core.vllm_versions import NEWEST

VOCAB = 1000


@dataclass(slots=True)
class Arrival:
    request_id: str
    step: int  # the scheduler step before which it is added
    prompt: list[int]
    max_tokens: int


@dataclass(slots=True)
class Scenario:
    """One random configuration and request stream. Invariant: every request can run alone in the empty cache
    (kvplan accepts it; vLLM, which does not check, would otherwise preempt it forever)."""

    seed: int
    block_size: int
    num_blocks: int
    max_num_batched_tokens: int
    max_num_seqs: int
    enable_chunked_prefill: bool
    enable_prefix_caching: bool
    watermark_blocks: int
    reserve_full_isl: bool
    max_model_len: int
    long_prefill_token_threshold: int = 0
    arrivals: list[Arrival] = field(default_factory=list)
    # A hybrid model: `sliding_groups` KV cache groups of sliding-window layers (window `sliding_window`) and one
    # full-attention group (vLLM's hybrid allocator); 0: every layer full attention, one group.
    sliding_window: int = 0
    sliding_groups: int = 0
    # vLLM 0.34's cache-aware admission: the window (0: off) and the usage threshold
    cache_aware_window: int = 0
    cache_aware_threshold: float = 0.5


def watermark_fraction(blocks: int, pool_blocks: int) -> float:
    """The watermark fraction that makes `int(fraction * pool_blocks)` (how both schedulers turn it into blocks)
    equal `blocks`. vLLM's pool counts its null block, so each side is given the fraction of its own pool."""
    return (blocks + 0.5) / pool_blocks if blocks else 0.0


@dataclass(slots=True)
class StepRecord:
    scheduled: dict[str, int]  # request id -> tokens scheduled in the step
    hits: dict[str, int]  # request id admitted from waiting -> prefix-cache hit tokens
    preempted: list[str]  # sorted (vLLM reports a set)
    finished: list[str]  # sorted
    free_after_schedule: int
    free_after_update: int
    running: list[str]
    waiting: list[str]


def sample_token(request_id: str, index: int) -> int:
    """The fake model's output token `index` of a request: deterministic, the same on both sides."""
    value = 17
    for ch in f"{request_id}/{index}":
        value = (value * 131 + ord(ch)) % 1_000_003
    return value % VOCAB


def make_scenario(seed: int) -> Scenario:
    """A seeded random scenario: a tight pool that preempts, shared prefixes (some prompts repeated exactly, so
    blocks are computed twice and keyed twice), chunked prefill, a small max_num_seqs, arrivals over time."""
    rng = random.Random(seed)
    bs = rng.choice((1, 2, 4, 8, 16))
    chunked = rng.random() < 0.85
    budget = rng.choice((8, 16, 32, 64, 128, 256))
    max_len = rng.choice((48, 96, 160, 256))
    if not chunked:
        max_len = min(max_len, budget)  # vLLM requires max_model_len <= the token budget without chunking
        budget = max(budget, max_len)
    need = -(-max_len // bs)  # blocks of the longest request
    num_blocks = need + rng.randint(0, 3 * need)
    seqs = rng.choice([n for n in (1, 2, 3, 4, 8, 16, 64) if n <= budget])  # vLLM: max_num_seqs <= the budget
    scenario = Scenario(seed, bs, num_blocks, budget, seqs, chunked,
                        rng.random() < 0.85, int(rng.choice((0.0, 0.0, 0.01, 0.05, 0.1)) * num_blocks),
                        rng.random() < 0.75, max_len)
    # drawn apart, so that the other draws (and every earlier scenario's requests) stay as they were
    scenario.long_prefill_token_threshold = random.Random(seed * 7919 + 1).choice(
        [t for t in (0, 0, 8, 24, 64) if t <= max_len])  # vLLM: at most max_model_len
    templates = [[rng.randrange(VOCAB) for _ in range(rng.randint(0, max_len // 2))] for _ in range(3)]
    repeated: list[list[int]] = []
    step = 0
    for i in range(rng.randint(4, 40)):
        step += rng.choice((0, 0, 0, 1, 1, 2, 5))
        if repeated and rng.random() < 0.15:
            prompt = list(rng.choice(repeated))
        else:
            prompt = list(rng.choice(templates)) if rng.random() < 0.7 else []
            prompt += [rng.randrange(VOCAB) for _ in range(rng.randint(1, max_len // 2))]
            prompt = prompt[:max_len - 1]
            repeated.append(prompt)
        max_tokens = rng.randint(1, min(40, max_len - len(prompt)))
        scenario.arrivals.append(Arrival(f"r{i}", step, prompt, max_tokens))
    return scenario


def make_hybrid_scenario(seed: int) -> Scenario:
    """`make_scenario(seed)`'s requests and settings on a hybrid model: 1-3 sliding groups with a window of 2 to
    64 tokens beside one full group, the pool sized so that every request fits alone (kvplan's admission rule)."""
    s = make_scenario(seed)
    rng = random.Random(seed * 104729 + 3)
    s.sliding_window, s.sliding_groups = rng.randint(2, 64), rng.randint(1, 3)
    floor = hybrid_cache(s, 10**6).peak_blocks(s.max_model_len - 1, s.max_num_batched_tokens)
    s.num_blocks = floor + rng.randint(0, 3 * floor)
    s.watermark_blocks = int(s.watermark_blocks and rng.choice((0.0, 0.01, 0.05)) * s.num_blocks)
    return s


def make_cache_aware_scenario(seed: int) -> Scenario:
    """`make_scenario(seed)`'s requests with prefix caching on and vLLM 0.34's cache-aware admission: a window of
    2 to 64 requests, the usage threshold 0 (every step) for even seeds and 0.5 (vLLM's default) for odd ones."""
    s = make_scenario(seed)
    rng = random.Random(seed * 15485863 + 5)
    s.enable_prefix_caching = True
    s.cache_aware_window = rng.choice((2, 4, 8, 16, 64))
    s.cache_aware_threshold = 0.0 if seed % 2 == 0 else 0.5
    return s


def make_unchunked_scenario(seed: int) -> Scenario:
    """`make_scenario(seed)`'s requests with chunked prefill off and a long-prefill threshold (which vLLM 0.34
    ignores without chunked prefill and 0.33 applied), the budget raised to max_model_len as vLLM requires."""
    s = make_scenario(seed)
    rng = random.Random(seed * 32452843 + 7)
    s.enable_chunked_prefill = False
    s.max_num_batched_tokens = max(s.max_num_batched_tokens, s.max_model_len)
    s.long_prefill_token_threshold = rng.choice([t for t in (4, 8, 24, 64) if t <= s.max_model_len])
    return s


def hybrid_layout(s: Scenario) -> KVLayout:
    groups = (KVGroup(SLIDING, 1, s.sliding_window),) * s.sliding_groups + (KVGroup(FULL, 1),)
    return KVLayout(groups, 1)


def hybrid_cache(s: Scenario, num_blocks: int) -> HybridCacheConfig:
    return HybridCacheConfig(block_size=s.block_size, num_blocks=num_blocks, max_model_len=s.max_model_len,
                             enable_prefix_caching=s.enable_prefix_caching,
                             watermark=watermark_fraction(s.watermark_blocks, num_blocks), kv_layout=hybrid_layout(s))


def describe(s: Scenario) -> str:
    return (f"seed {s.seed}: block {s.block_size}, {s.num_blocks} blocks, budget {s.max_num_batched_tokens}, "
            f"max_num_seqs {s.max_num_seqs}, chunked {s.enable_chunked_prefill}, prefix caching "
            f"{s.enable_prefix_caching}, watermark {s.watermark_blocks} blocks, reserve_full_isl {s.reserve_full_isl}, "
            f"max_model_len {s.max_model_len}, long_prefill_token_threshold {s.long_prefill_token_threshold}, "
            f"{len(s.arrivals)} requests"
            + (f", cache-aware window {s.cache_aware_window} from usage {s.cache_aware_threshold}"
               if s.cache_aware_window else "")
            + (f", {s.sliding_groups} sliding groups of window {s.sliding_window} + 1 full" if s.sliding_window
               else ""))


# -- the kvplan side -----------------------------------------------------------------------------------------
class KvplanSide:
    def __init__(self, s: Scenario, version: str = NEWEST) -> None:
        cache = CacheConfig(block_size=s.block_size, num_blocks=s.num_blocks,
                            enable_prefix_caching=s.enable_prefix_caching, max_model_len=s.max_model_len,
                            watermark=watermark_fraction(s.watermark_blocks, s.num_blocks))
        if s.sliding_window:
            cache = hybrid_cache(s, s.num_blocks)
        config = SchedulerConfig(max_num_batched_tokens=s.max_num_batched_tokens, max_num_seqs=s.max_num_seqs,
                                 enable_chunked_prefill=s.enable_chunked_prefill,
                                 scheduler_reserve_full_isl=s.reserve_full_isl,
                                 long_prefill_token_threshold=s.long_prefill_token_threshold,
                                 vllm_version=version, cache_aware_admission_window=s.cache_aware_window,
                                 cache_aware_admission_threshold=s.cache_aware_threshold)
        self.sched = Scheduler(cache, config)

    def add(self, a: Arrival) -> None:
        request = make_request(a.request_id, prompt_token_ids=a.prompt, max_tokens=a.max_tokens,
                               arrival_s=float(a.step))
        if not self.sched.add_request(request):
            raise AssertionError(f"kvplan rejected {a.request_id}: {request.finish_reason}")

    def has_unfinished(self) -> bool:
        return self.sched.has_unfinished()

    def step(self) -> StepRecord:
        sched = self.sched
        waiting = {r.request_id for r in sched.waiting}
        out = sched.schedule()
        scheduled = {item.request_id: item.num_new_tokens for item in out.scheduled}
        hits = {item.request_id: item.start_pos for item in out.scheduled if item.request_id in waiting}
        free_mid = sched.kv.num_free_blocks
        sampled = [sample_token(item.request_id, item.request.num_output_tokens) if item.samples else None
                   for item in out.scheduled]
        result = sched.update(out, sampled)
        return StepRecord(scheduled, hits, sorted(out.preempted), sorted(r.request_id for r in result.finished),
                          free_mid, sched.kv.num_free_blocks, [r.request_id for r in sched.running],
                          [r.request_id for r in sched.waiting])


# -- the vLLM side -------------------------------------------------------------------------------------------
_MODEL_DIR: list[str] = []


def _model_dir() -> str:
    """A folder holding a tiny Llama config.json: enough for vLLM's ModelConfig, no weights."""
    if not _MODEL_DIR:
        folder = Path(tempfile.mkdtemp(prefix="kvplan-parity-model-"))
        (folder / "config.json").write_text(json.dumps({
            "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
            "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 4,
            "num_hidden_layers": 2, "vocab_size": VOCAB, "max_position_embeddings": 4096,
            "torch_dtype": "float32"}))
        _MODEL_DIR.append(str(folder))
    return _MODEL_DIR[0]


def vllm_version() -> str:
    import vllm

    return vllm.__version__


def vllm_minor() -> str:
    """The installed vLLM's major.minor: the `vllm_version` kvplan's side is given."""
    return ".".join(vllm_version().split(".")[:2])


class VllmSide:
    """vLLM's real V1 `Scheduler` and `KVCacheManager` (synchronous scheduling, no connector, no spec decode)."""

    def __init__(self, s: Scenario) -> None:
        import torch
        from vllm.config import CacheConfig as VCacheConfig
        from vllm.config import DeviceConfig, ModelConfig, VllmConfig
        from vllm.config import SchedulerConfig as VSchedulerConfig
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.core.sched.scheduler import Scheduler as VScheduler
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec
        from vllm.v1.structured_output import StructuredOutputManager

        model = ModelConfig(model=_model_dir(), skip_tokenizer_init=True, max_model_len=s.max_model_len,
                            dtype="float32")
        num_blocks = s.num_blocks + 1  # block 0 is vLLM's null block
        watermark = watermark_fraction(s.watermark_blocks, num_blocks)
        sched_config = VSchedulerConfig(
            max_num_batched_tokens=s.max_num_batched_tokens, max_num_seqs=s.max_num_seqs,
            max_model_len=s.max_model_len, is_encoder_decoder=False, enable_chunked_prefill=s.enable_chunked_prefill,
            scheduler_reserve_full_isl=s.reserve_full_isl, watermark=watermark, async_scheduling=False,
            long_prefill_token_threshold=s.long_prefill_token_threshold,
            **({"cache_aware_admission_window": s.cache_aware_window,
                "cache_aware_admission_threshold": s.cache_aware_threshold} if s.cache_aware_window else {}))
        cache_config = VCacheConfig(block_size=s.block_size, enable_prefix_caching=s.enable_prefix_caching)
        config = VllmConfig(scheduler_config=sched_config, model_config=model, cache_config=cache_config,
                            device_config=DeviceConfig(device="cpu"))
        sc = config.scheduler_config
        actual = (sc.max_num_batched_tokens, sc.max_num_seqs, sc.enable_chunked_prefill,
                  config.cache_config.enable_prefix_caching, sc.scheduler_reserve_full_isl, sc.watermark)
        wanted = (s.max_num_batched_tokens, s.max_num_seqs, s.enable_chunked_prefill, s.enable_prefix_caching,
                  s.reserve_full_isl, watermark)
        if actual != wanted:
            raise AssertionError(f"vLLM changed the configuration: {actual} != {wanted}")
        config.cache_config.num_gpu_blocks = num_blocks
        shape = dict(block_size=s.block_size, num_kv_heads=1, head_size=8, dtype=torch.float32)
        # kvplan's group order (the kinds as they first appear: sliding layers first); prefix-cache retention
        # dense (None), as kvplan models it
        groups = [KVCacheGroupSpec([f"layer.{i}"], SlidingWindowSpec(sliding_window=s.sliding_window, **shape))
                  for i in range(s.sliding_groups)]
        groups.append(KVCacheGroupSpec([f"layer.{s.sliding_groups}"], FullAttentionSpec(**shape)))
        kv_config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups,
                                  prefix_cache_retention_interval=None)
        self.sched = VScheduler(vllm_config=config, kv_cache_config=kv_config,
                                structured_output_manager=StructuredOutputManager(config),
                                block_size=s.block_size, log_stats=False)
        init_none_hash(sha256)
        self.hasher = get_request_block_hasher(s.block_size, sha256)

    def add(self, a: Arrival) -> None:
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request

        params = SamplingParams(max_tokens=a.max_tokens, ignore_eos=True)
        self.sched.add_request(Request(a.request_id, list(a.prompt), params, None, arrival_time=float(a.step),
                                       block_hasher=self.hasher))

    def has_unfinished(self) -> bool:
        return self.sched.has_unfinished_requests()

    def _free(self) -> int:
        return self.sched.kv_cache_manager.block_pool.get_num_free_blocks()

    def step(self) -> StepRecord:
        from vllm.v1.outputs import ModelRunnerOutput
        from vllm.v1.request import RequestStatus as VStatus

        sched = self.sched
        waiting = {r.request_id for r in sched.waiting}
        out = sched.schedule()
        scheduled = dict(out.num_scheduled_tokens)
        hits = {rid: sched.requests[rid].num_computed_tokens - n for rid, n in scheduled.items() if rid in waiting}
        free_mid = self._free()
        ids = list(scheduled)
        sampled = []
        for rid in ids:
            request = sched.requests[rid]
            done = request.num_computed_tokens >= request.num_tokens  # its chunk reached the last token
            sampled.append([sample_token(rid, request.num_output_tokens)] if done else [])
        before = set(sched.requests)
        # vLLM <= 0.33 takes the index map; 0.34 reads the order of req_ids
        indexed = _has_field(ModelRunnerOutput, "req_id_to_index")
        extra = {"req_id_to_index": {r: i for i, r in enumerate(ids)}} if indexed else {}
        sched.update_from_output(out, ModelRunnerOutput(req_ids=ids, sampled_token_ids=sampled, **extra))
        finished = sorted(rid for rid in before if rid not in sched.requests
                          or sched.requests[rid].status not in (VStatus.RUNNING, VStatus.WAITING, VStatus.PREEMPTED))
        return StepRecord(scheduled, hits, sorted(out.preempted_req_ids), finished, free_mid, self._free(),
                          [r.request_id for r in sched.running], [r.request_id for r in sched.waiting])


def _has_field(cls: type, name: str) -> bool:
    import dataclasses

    return any(f.name == name for f in dataclasses.fields(cls))


# -- driving both ----------------------------------------------------------------------------------------------
def run_side(side: KvplanSide | VllmSide, s: Scenario, max_steps: int = 5000) -> list[StepRecord]:
    """Drive one side through the scenario: add each step's arrivals, then one schedule/update cycle; steps
    with nothing unfinished skip ahead to the next arrival."""
    records: list[StepRecord] = []
    pending = sorted(s.arrivals, key=lambda a: a.step)
    i, step = 0, 0
    while i < len(pending) or side.has_unfinished():
        if not side.has_unfinished() and pending[i].step > step:
            step = pending[i].step
        while i < len(pending) and pending[i].step <= step:
            side.add(pending[i])
            i += 1
        records.append(side.step())
        step += 1
        if len(records) > max_steps:
            raise AssertionError(f"{describe(s)}: no end after {max_steps} steps")
    return records


def first_difference(a: list[StepRecord], b: list[StepRecord]) -> str | None:
    """Where two step records first differ, in words; None when they are identical."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        for name in StepRecord.__slots__:
            if getattr(x, name) != getattr(y, name):
                return f"step {i}: {name}: kvplan {getattr(x, name)!r} != vLLM {getattr(y, name)!r}"
    if len(a) != len(b):
        return f"kvplan ran {len(a)} steps, vLLM {len(b)}"
    return None


def kvplan_finishes_everything(records: list[StepRecord], s: Scenario) -> bool:
    return sorted(rid for r in records for rid in r.finished) == sorted(a.request_id for a in s.arrivals)



@dataclass(slots=True)
class Tally:
    """What a batch of identical scenarios exercised (so that a pass means something)."""

    scenarios: int = 0
    steps: int = 0
    admissions: int = 0
    hit_tokens: int = 0
    preemptions: int = 0
    finishes: int = 0
    scenarios_preempting: int = 0
    scenarios_hitting: int = 0

    def add(self, records: list[StepRecord]) -> None:
        self.scenarios += 1
        self.steps += len(records)
        hits = sum(v for r in records for v in r.hits.values())
        preempted = sum(len(r.preempted) for r in records)
        self.admissions += sum(len(r.hits) for r in records)
        self.hit_tokens += hits
        self.preemptions += preempted
        self.finishes += sum(len(r.finished) for r in records)
        self.scenarios_preempting += preempted > 0
        self.scenarios_hitting += hits > 0

    def line(self) -> str:
        return (f"{self.scenarios} scenarios, {self.steps} steps, {self.admissions} admissions "
                f"({self.hit_tokens} prefix-hit tokens), {self.preemptions} preemptions, {self.finishes} finishes; "
                f"{self.scenarios_preempting} scenarios preempt, {self.scenarios_hitting} hit the prefix cache")
