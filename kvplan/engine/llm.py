"""`LLM`: the offline engine API (vLLM-shaped) and the step-by-step interface used for replay.

    llm = LLM("tiny-llama", block_size=16, kv_cache_memory=64 << 20)
    outputs = llm.generate([[1, 2, 3], [4, 5]], SamplingParams(temperature=0, max_tokens=8))

One `step()` = `scheduler.schedule()` -> block copies / swaps -> prepare packed inputs -> forward -> sample ->
`scheduler.update()`; the scheduler, block pool and KV manager are the shared `engine.core` ones.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from kvplan.engine.attention import register_paged_attention
from kvplan.engine.backends import default_backend, make_backend
from kvplan.engine.beam_search import BeamSearch
from kvplan.engine.core import CacheConfig, ConfigError, Scheduler, SchedulerConfig, make_request
from kvplan.engine.core.outputs import SchedulerOutput, UpdateOutput
from kvplan.engine.core.prefix_tiers import offloading_blocks
from kvplan.engine.core.request import sample_index
from kvplan.engine.core.setting_classes import core_config
from kvplan.engine.core.settings import SETTINGS
from kvplan.engine.cpu_linear import can_pack, pack_linears
from kvplan.engine.kv_cache import KVLayout, PagedKVCache, check_host_memory
from kvplan.engine.kv_transfer.config import KVTransferConfig
from kvplan.engine.kv_transfer.connector import KVConnector, check_params
from kvplan.engine.lora import lora_id_of, lora_runtime
from kvplan.engine.model_runner import ModelRunner
from kvplan.engine.models import load_model
from kvplan.engine.options import engine_options
from kvplan.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from kvplan.engine.profiler import StepProfiler
from kvplan.engine.rope import rope_for_positions
from kvplan.engine.sampling import SampledToken, SamplingParams, sample_row
from kvplan.engine.spec_decode.draft_model import DraftModel
from kvplan.engine.spec_decode.ngram import propose_ngram
from kvplan.engine.spec_decode.rejection import verify
from kvplan.errors import UserError

# kv_cache_dtype names (vLLM's where it has one) -> the cache's torch dtype
KV_TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
                   "fp8_e4m3": torch.float8_e4m3fn, "fp8": torch.float8_e4m3fn, "int8": torch.int8}


@dataclass(slots=True)
class StepTrace:
    """What the last `step()` did: read by the live replay and the calibration driver."""

    output: SchedulerOutput
    update: UpdateOutput
    times_s: dict[str, float]  # schedule / prepare / forward / sample / update
    kv_usage: float  # fraction of KV blocks in use while the step ran


@dataclass(slots=True)
class _Group:
    """One user request: its n sequences (index 0 is the request itself, j > 0 its forked children)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    metrics: RequestMetrics
    generators: list[torch.Generator]
    sequences: dict[int, object] = field(default_factory=dict)  # index -> core Request
    logprobs: dict[int, list[SampledToken]] = field(default_factory=dict)
    teacher: list[int] | None = None  # forced continuation (scoring): the token each step must produce
    teacher_logprobs: list[float] = field(default_factory=list)  # log p(teacher token) at each step
    beam: BeamSearch | None = None  # beam search: its decisions; the sequences are its beams
    finished: int = 0

    @property
    def num_sequences(self) -> int:
        """Sequences that must finish: n; for beams, those that exist (a search may end before it forks)."""
        return len(self.sequences) if self.beam is not None else self.params.n


class LLM:
    def __init__(self, model: str, *, seed: int = 0, device: str | None = None, attention_backend: str | None = None,
                 profile_path: str | Path | None = None, kv_transfer: KVTransferConfig | None = None,
                 lora_modules: dict[str, str] | None = None, **settings: object) -> None:
        """`settings`: any of `EngineOptions` (engine.core.settings declares them: names, defaults, ranges);
        `kv_transfer`: this instance's `--kv-transfer-config` (engine.kv_transfer.connector: a producer serves
        held KV on kv_port, a consumer pulls it); `lora_modules`: adapter name -> PEFT directory (vLLM's
        --lora-modules; needs enable_lora; engine.lora)."""
        if isinstance(settings.get("dtype"), torch.dtype):
            settings["dtype"] = str(settings["dtype"]).removeprefix("torch.")
        o = self.options = engine_options(settings)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        dtype = getattr(torch, o.dtype)  # checked: one of MODEL_DTYPES
        self.loaded = load_model(model, dtype=dtype, device=str(self.device),
                                 attn_implementation=register_paged_attention())
        if can_pack(self.loaded.model):  # bf16/fp16 on CPU: oneDNN weights packed once, not on every call
            pack_linears(self.loaded.model, batch_hint=min(o.max_num_seqs, 64))
        self.lora = lora_runtime(self.loaded.model, o, lora_modules or {}, self.device, dtype)
        self.tokenizer = self.loaded.tokenizer
        self.max_model_len = min(o.max_model_len or self.loaded.max_model_len, self.loaded.max_model_len)
        layout = KVLayout(self.loaded.num_layers, self.loaded.num_kv_heads, self.loaded.head_dim,
                          o.block_size, self._kv_dtype(o.kv_cache_dtype, dtype))
        rope = rope_for_positions(self.loaded.model, o.position_mode, o.window_tokens, attention_backend)
        if rope is not None and attention_backend is None and self.device.type == "cuda":
            attention_backend = "torch"  # the Triton kernels have no per-query rotation
        backend = make_backend(attention_backend or default_backend(self.device), self.device)
        num_blocks = o.num_blocks or self._num_blocks(layout, o.kv_cache_memory, o.gpu_memory_utilization, backend,
                                                      o.max_num_batched_tokens)
        num_cpu_blocks = layout.blocks_in(o.swap_space) if o.preemption_mode == "swap" else 0
        tier_blocks = offloading_blocks(o.kv_offloading_size, layout.bytes_per_block, o.kv_offloading_blocks)
        check_host_memory(layout, num_blocks, num_cpu_blocks + tier_blocks, self.device)
        try:
            cache = core_config(CacheConfig, o, num_blocks=num_blocks, num_cpu_blocks=num_cpu_blocks,
                                kv_offloading_blocks=tier_blocks, max_model_len=self.max_model_len)
        except ConfigError as exc:
            budget = layout.bytes_per_block * num_blocks
            raise UserError(f"KV budget too small: {budget} bytes hold {num_blocks} blocks of {o.block_size} tokens "
                             f"({layout.bytes_per_block} bytes each): {exc}") from exc
        self.scheduler = Scheduler(cache, core_config(SchedulerConfig, o))
        # speculative decoding: the proposer (engine.spec_decode); drafts' distributions wait here for their step
        self.spec = self.scheduler.config.speculative
        self.draft_model = (DraftModel(self.spec.model, self.loaded.vocab_size, dtype, self.device)
                            if self.spec is not None and self.spec.model is not None else None)
        self._draft_q: dict[str, torch.Tensor] = {}
        self.kv_cache = PagedKVCache(layout, num_blocks, num_cpu_blocks, self.device, tier_blocks)
        self.runner = ModelRunner(self.loaded.model, self.kv_cache, backend, self.device, o.sink_tokens,
                                  o.window_tokens, rope)
        self._seeds = torch.Generator().manual_seed(seed)
        self._groups: dict[str, _Group] = {}
        self._owner: dict[str, tuple[str, int]] = {}  # sequence id -> (group id, index)
        self._counter = 0
        self.last_step: StepTrace | None = None
        self.profile_meta = {
            "model": model, "device": str(self.device), "dtype": str(dtype).removeprefix("torch."),
            "kv_dtype": str(layout.dtype).removeprefix("torch."), "block_size": o.block_size,
            "num_blocks": num_blocks, "num_cpu_blocks": num_cpu_blocks, "kv_offloading_blocks": tier_blocks,
            "kv_offloading_backend": o.kv_offloading_backend, "sink_tokens": o.sink_tokens,
            "window_tokens": o.window_tokens, "position_mode": o.position_mode,
            "threads": torch.get_num_threads(), "torch": str(torch.__version__)}
        self.profiler = None if profile_path is None else StepProfiler(profile_path, self.profile_meta)
        self.kv_transfer = kv_transfer
        if kv_transfer is not None and o.window_tokens:  # released blocks leave holes no transfer can carry
            raise UserError("--kv-transfer-config with a sink+window cache: the window releases blocks a decode "
                            "instance would need; allowed: no window_tokens on a prefill/decode instance")
        self.kv_connector = KVConnector(kv_transfer, self.kv_cache) if kv_transfer is not None else None

    @staticmethod
    def _kv_dtype(name: str, model_dtype: torch.dtype) -> torch.dtype:
        """`auto`: the model's dtype; `fp8_e4m3` (vLLM's `fp8`) and `int8` quantize on write, with one float32
        scale per token per KV head (kernels.quant), and dequantize on read."""
        return model_dtype if name == "auto" else KV_TORCH_DTYPES[name]  # checked: one of settings.KV_CACHE_DTYPES

    def _num_blocks(self, layout: KVLayout, kv_cache_memory: int | None, utilization: float, backend,
                    max_batched_tokens: int) -> int:
        if self.device.type == "cuda" and kv_cache_memory is None:
            from kvplan.engine.memory_profile import gpu_kv_blocks

            return gpu_kv_blocks(self.loaded.model, layout, backend, self.device, utilization, max_batched_tokens)
        return layout.blocks_in(kv_cache_memory if kv_cache_memory is not None
                                else SETTINGS["kv_cache_memory"].default)

    @property
    def num_kv_blocks(self) -> int:
        return self.kv_cache.num_blocks

    # -- requests ------------------------------------------------------------------------------------------
    def encode(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise UserError("this model has no tokenizer: pass prompts as lists of token ids")
            return self.tokenizer.encode(prompt)
        return [int(t) for t in prompt]

    def check_prompt(self, tokens: list[int], params: SamplingParams) -> None:
        """Raise ValueError for a request that cannot run; nothing is changed."""
        if not tokens:
            raise UserError("empty prompt: a request needs at least one token")
        if len(tokens) >= self.max_model_len:
            raise UserError(f"prompt of {len(tokens)} tokens is longer than the model's context "
                             f"(max_model_len {self.max_model_len})")
        if len(tokens) + params.max_tokens > self.max_model_len:
            raise UserError(f"prompt ({len(tokens)} tokens) + max_tokens ({params.max_tokens}) exceeds the model's "
                             f"context (max_model_len {self.max_model_len})")
        vocab = self.loaded.vocab_size
        if min(tokens) < 0 or max(tokens) >= vocab:
            raise UserError(f"prompt token ids must lie in [0, {vocab}); got {min(tokens)}..{max(tokens)}")

    def add_request(self, prompt: str | Sequence[int], params: SamplingParams | None = None, *,
                    request_id: str | None = None, arrival_s: float | None = None, priority: int = 0,
                    teacher_token_ids: Sequence[int] | None = None, kv_transfer_params: dict | None = None,
                    lora: str | None = None) -> str:
        """Queue a request. `teacher_token_ids` scores a continuation instead of sampling one: each step
        produces the next given token (max_tokens = their count, n = 1) and records its log-probability under
        the step's logits, read back with `teacher_logprobs` when the request finishes: the decode path, cache
        policy and KV dtype included (perplexity under a bounded cache). `kv_transfer_params` (vLLM's): with
        `do_remote_decode` the request finishes holding its KV for a decode instance; with `do_remote_prefill` its
        prompt's KV is read from the prefill instance the params name (engine.kv_transfer.connector). `lora`:
        the adapter it runs with (a name of `lora_modules`; None: the base model)."""
        params = params or SamplingParams()
        if teacher_token_ids is not None:
            params = SamplingParams(max_tokens=len(teacher_token_ids), ignore_eos=True)
        tokens = self.encode(prompt)
        self.check_prompt(tokens, params)
        check_params(kv_transfer_params, self.kv_transfer)
        lora_id = lora_id_of(self.lora, lora)
        rid = request_id if request_id is not None else f"req-{self._counter}"
        if rid in self._groups:
            raise UserError(f"request id {rid!r} is already in use")
        self._counter += 1
        stops = set(params.stop_token_ids) | (set() if params.ignore_eos else set(self.loaded.eos_token_ids))
        width = params.beam_width
        request = make_request(rid, prompt_token_ids=tokens, max_tokens=params.max_tokens, n=width or params.n,
                               beam=width > 0, stop_token_ids=stops, arrival_s=arrival_s or 0.0, priority=priority,
                               kv_transfer_params=kv_transfer_params, lora_id=lora_id, lora_name=lora or "")
        reason = self.scheduler.rejection_reason(request)
        if reason is not None:
            raise UserError(f"request {rid} cannot run: {reason}")
        seed = params.seed if params.seed is not None else int(torch.randint(2**62, (1,), generator=self._seeds))
        group = _Group(rid, prompt if isinstance(prompt, str) else None, tokens, params,
                       RequestMetrics(arrival_s if arrival_s is not None else time.perf_counter()),
                       [torch.Generator().manual_seed(seed + j) for j in range(params.n)])
        group.sequences[0] = request
        group.teacher = [int(t) for t in teacher_token_ids] if teacher_token_ids is not None else None
        if width:
            group.beam = BeamSearch(width, params.max_tokens, sorted(stops), params.length_penalty,
                                    params.early_stopping)
        self._groups[rid] = group
        self._owner[rid] = (rid, 0)
        self.scheduler.add_request(request)
        if self.kv_connector is not None:
            self.kv_connector.expect(rid, kv_transfer_params)
        return rid

    def new_output_tokens(self, request_id: str, sent: dict[int, int]) -> list[tuple[int, list[int]]]:
        """(sequence index, tokens after the first `sent[index]`) for each sequence of an unfinished request that
        has generated more than `sent` says (a sequence not forked yet is absent; none for a request not running
        here). Streaming servers call this for every stream after every step, so only new tokens are copied;
        preemption by recompute keeps a sequence's tokens, so they only grow."""
        group = self._groups.get(request_id)
        if group is None:
            return []
        out = []
        for index in sorted(group.sequences):
            request, done = group.sequences[index], sent.get(index, 0)
            if request.num_output_tokens > done:
                out.append((index, request.token_ids[request.prompt_len + done:]))
        return out

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    def abort(self, request_id: str) -> None:
        group = self._groups.pop(request_id, None)
        if self.kv_connector is not None:
            self.kv_connector.forget(request_id)
        if group is not None:
            for request in group.sequences.values():
                self.scheduler.abort(request.request_id)
                self._owner.pop(request.request_id, None)

    # -- one engine step -----------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one scheduler step; returns the requests that finished in it."""
        times: dict[str, float] = {}
        mark = self._clock()
        failed = self._kv_reports()
        out = self.scheduler.schedule()
        usage = self.scheduler.kv.usage()  # the blocks this step holds (the simulator reads it at the same point)
        if self.kv_connector is not None:
            self.kv_connector.start(out)
        mark = scheduled_at = self._lap(times, "schedule", mark)
        self.runner.apply_memory_ops(out)
        sampled: list = [None] * len(out.scheduled)
        if out.scheduled:
            prepared = self.runner.prepare(out)
            mark = self._lap(times, "prepare", mark)
            if self.lora is not None:  # the step's adapters into their slots (timed apart: adapter loads), each
                self.lora.load(out)  # row tagged with its slot
                self.lora.bind(prepared.packed)
                mark = self._lap(times, "lora", mark)
            logits = self.runner.forward(prepared)
            mark = self._lap(times, "forward", mark)
            self._sample(out, prepared.sampled_items, logits, sampled)
            mark = self._lap(times, "sample", mark)
        result = self.scheduler.update(out, sampled)
        if self.kv_connector is not None:
            self.kv_connector.exported(result, {r.request_id: r.prompt_len for r in result.finished})
        self._advance_beams(out, result)
        if self.spec is not None:
            self._propose()
        now = self._lap(times, "update", mark)
        finished = self._record(out, result, scheduled_at, now)
        self.last_step = StepTrace(out, result, times, usage)
        if self.profiler is not None:
            self.profiler.record(out, self.kv_cache.layout.block_size, times, result.spec,
                                 **(self.lora.step_loads() if self.lora is not None else {}))
        if self.kv_connector is not None:
            self.kv_connector.idle_wait(out)
        return failed + finished

    @property
    def holds_kv_for_remote(self) -> bool:
        """P/D prefill side: finished requests' blocks are held until decode instances have read them."""
        return bool(self.scheduler.remote.sending)

    def release_read_kv(self) -> None:
        """Between steps of an idle engine: free the held blocks that have been read or outlived their lease."""
        if self.kv_connector is not None:
            self.kv_connector.reports(self.scheduler)

    def _kv_reports(self) -> list[RequestOutput]:
        """P/D: the connector's reports to the core, and an output for each request whose KV pull failed (vLLM's
        kv_load_failure_policy fail: the request ends with the reason)."""
        if self.kv_connector is None:
            return []
        self.kv_connector.reports(self.scheduler)
        for rid, (start, end) in self.kv_connector.load_times.items():
            if rid in self._groups:
                self._groups[rid].metrics.kv_load_start_s, self._groups[rid].metrics.kv_load_end_s = start, end
        self.kv_connector.load_times.clear()
        failed = []
        for rid, why in self.kv_connector.failed.items():
            group = self._groups.pop(rid, None)
            if group is not None:
                self._owner.pop(rid, None)
                group.metrics.finished_s = time.perf_counter()
                failed.append(RequestOutput(rid, group.prompt, group.prompt_token_ids,
                                            [CompletionOutput(0, [], None, "error")], group.metrics,
                                            error=f"KV transfer failed: {why}"))
        self.kv_connector.failed.clear()
        return failed

    def _clock(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _lap(self, times: dict[str, float], name: str, since: float) -> float:
        now = self._clock()
        times[name] = now - since
        return now

    def _sample(self, out: SchedulerOutput, items: list, logits: torch.Tensor, sampled: list) -> None:
        position = {id(item): i for i, item in enumerate(out.scheduled)}
        argmax = logits.argmax(dim=-1).tolist()  # one batched argmax serves every plain greedy row
        row = -1
        for item in items:
            row += 1
            request = item.request
            group_id, index = self._owner[request.request_id]
            group = self._groups[group_id]
            params = group.params
            if item.spec_token_ids:  # rows for its last verified token and each draft: the verifier's tokens
                drafts = item.spec_token_ids
                sampled[position[id(item)]] = verify(logits[row:row + len(drafts) + 1], drafts, params,
                                                     group.generators[index], self._draft_q.pop(request.request_id,
                                                                                                None))
                row += len(drafts)
            elif group.beam is not None:  # beam search: the group's step decides once every beam has its row
                group.beam.rows[index] = torch.log_softmax(logits[row].float(), dim=-1)
            elif group.teacher is not None:  # scoring: the given token, and its log-probability here
                token = group.teacher[len(group.teacher_logprobs)]
                group.teacher_logprobs.append(float(torch.log_softmax(logits[row].float(), dim=-1)[token]))
                sampled[position[id(item)]] = token
            elif request.n > 1 and not request.forked:  # first tokens of all n sequences, from the prompt's logits
                draws = [sample_row(logits[row], params, g) for g in group.generators]
                sampled[position[id(item)]] = [d.token for d in draws]
                if params.logprobs is not None:
                    for j, draw in enumerate(draws):
                        group.logprobs.setdefault(j, []).append(draw)
            elif params.greedy and params.logprobs is None:
                sampled[position[id(item)]] = argmax[row]
            else:
                draw = sample_row(logits[row], params, group.generators[index])
                sampled[position[id(item)]] = draw.token
                if params.logprobs is not None:
                    group.logprobs.setdefault(index, []).append(draw)

    def _propose(self) -> None:
        """Drafts for the next step of every running request that decodes plainly (no beam search, scoring or
        logprobs; an n > 1 request once forked): n-gram lookup or the draft model (engine.spec_decode)."""
        spec = self.spec
        assert spec is not None
        drafts: dict[str, list[int]] = {}
        self._draft_q = {}  # (the last step's were all taken by its verification, or their drafts dropped)
        for request in self.scheduler.requests_to_draft():  # (the core's rule: decoding, forked, no beam)
            group_id, index = self._owner[request.request_id]
            group = self._groups[group_id]
            if group.beam is not None or group.teacher is not None or group.params.logprobs is not None:
                continue
            tokens = request.token_ids
            if self.draft_model is None:
                drafts[request.request_id] = propose_ngram(tokens, spec.num_speculative_tokens,
                                                           spec.prompt_lookup_min, spec.prompt_lookup_max)
                continue
            proposed, q = self.draft_model.propose(tokens, spec.num_speculative_tokens, group.params,
                                                   group.generators[index])
            drafts[request.request_id] = proposed
            if q is not None:
                self._draft_q[request.request_id] = q
            else:
                self._draft_q.pop(request.request_id, None)
        self.scheduler.set_drafts(drafts)

    @property
    def spec_stats(self) -> dict[str, float | int | None]:
        """Speculative decoding's counters so far (vLLM's names) and the acceptance rate (None: none verified)."""
        stats = self.scheduler.stats
        return {"num_drafts": stats.num_drafts, "num_draft_tokens": stats.num_draft_tokens,
                "num_accepted_tokens": stats.num_accepted_tokens, "acceptance_rate": stats.acceptance_rate,
                "mean_acceptance_length": stats.mean_acceptance_length,
                "num_accepted_tokens_per_pos": list(stats.num_accepted_tokens_per_pos)}

    def _advance_beams(self, out: SchedulerOutput, result: UpdateOutput) -> None:
        """Step every beam group of this batch whose beams all have their log-probabilities (a group split across
        model steps by the budget or a preemption waits for its last beam): append, fork and prune by the
        decision, or end the group when its search is over."""
        for group_id in {self._owner[item.request_id][0] for item in out.scheduled if item.request.beam}:
            group = self._groups.get(group_id)
            members = [group.sequences[i] for i in sorted(group.sequences)] if group is not None else []
            if not members or not self.scheduler.beams_ready(members):
                continue
            plan = group.beam.step()
            step = (self.scheduler.finish_beams(members, "stop") if plan is None
                    else self.scheduler.advance_beams(members, plan))
            result.forked.extend(step.forked)
            result.finished.extend(step.finished)

    def _record(self, out: SchedulerOutput, result, scheduled_at: float, now: float) -> list[RequestOutput]:
        for child in result.forked:
            group_id, _ = self._owner[child.parent_id]
            index = sample_index(child.request_id)
            self._groups[group_id].sequences[index] = child
            self._owner[child.request_id] = (group_id, index)
        for item in out.scheduled:
            group_id, index = self._owner[item.request_id]
            metrics = self._groups[group_id].metrics
            if metrics.first_scheduled_s is None:
                metrics.first_scheduled_s = scheduled_at
                metrics.num_cached_tokens = item.num_cached_tokens
            if item.samples and index == 0:
                metrics.first_token_s = metrics.first_token_s or now
                verified = result.spec.get(item.request_id)  # speculative decoding: 1 + accepted tokens at once
                metrics.token_times_s.extend([now] * (1 if verified is None else verified[1] + 1))
        done = []
        for request in result.finished:
            group_id, index = self._owner.pop(request.request_id)
            group = self._groups[group_id]
            if index == 0 and result.spec:  # a stop inside an accepted run dropped the tokens after it
                del group.metrics.token_times_s[request.num_output_tokens:]
            group.finished += 1
            group.metrics.num_preemptions += request.num_preemptions
            if group.finished == group.num_sequences:
                group.metrics.finished_s = now
                done.append(self._output(self._groups.pop(group_id)))
        return done

    def _output(self, group: _Group) -> RequestOutput:
        if group.beam is not None:
            return self._beam_output(group)
        completions = []
        for index in sorted(group.sequences):
            request = group.sequences[index]
            tokens = request.output_token_ids
            completions.append(CompletionOutput(index, tokens, self._decode(tokens), request.finish_reason,
                                                group.logprobs.get(index) if group.params.logprobs is not None
                                                else None))
        transfer = self.kv_connector.sent_params.pop(group.request_id, None) if self.kv_connector else None
        return RequestOutput(group.request_id, group.prompt, group.prompt_token_ids, completions, group.metrics,
                             teacher_logprobs=group.teacher_logprobs if group.teacher is not None else None,
                             kv_transfer_params=transfer)

    def _beam_output(self, group: _Group) -> RequestOutput:
        completions = [CompletionOutput(i, h.token_ids, self._decode(h.token_ids), "stop" if h.finished_on_eos
                                        else "length", cumulative_logprob=h.cumulative_logprob, score=h.score)
                       for i, h in enumerate(group.beam.hypotheses())]
        return RequestOutput(group.request_id, group.prompt, group.prompt_token_ids, completions, group.metrics)

    def _decode(self, tokens: list[int]) -> str | None:
        return self.tokenizer.decode(tokens, skip_special_tokens=True) if self.tokenizer is not None else None

    # -- batch API -----------------------------------------------------------------------------------------
    def generate(self, prompts: Sequence[str | Sequence[int]],
                 params: SamplingParams | Sequence[SamplingParams] | None = None,
                 lora: str | Sequence[str | None] | None = None) -> list[RequestOutput]:
        """Run every prompt to completion; outputs in input order. All prompts are checked before any work.
        `lora`: one adapter name for all, or one per prompt (None: the base model)."""
        params_list = list(params) if isinstance(params, Sequence) else [params or SamplingParams()] * len(prompts)
        loras = [lora] * len(prompts) if lora is None or isinstance(lora, str) else list(lora)
        if len(loras) != len(prompts):
            raise UserError(f"got {len(prompts)} prompts but {len(loras)} adapters")
        for name in set(loras):
            lora_id_of(self.lora, name)
        if len(params_list) != len(prompts):
            raise UserError(f"got {len(prompts)} prompts but {len(params_list)} SamplingParams")
        for i, (prompt, p) in enumerate(zip(prompts, params_list, strict=True)):
            try:
                self.check_prompt(self.encode(prompt), p)
            except ValueError as exc:
                raise UserError(f"prompt {i}: {exc}") from None
        ids = [self.add_request(prompt, p, lora=name)
               for prompt, p, name in zip(prompts, params_list, loras, strict=True)]
        results: dict[str, RequestOutput] = {}
        while len(results) < len(ids):
            for output in self.step():
                results[output.request_id] = output
        return [results[rid] for rid in ids]

    def beam_search(self, prompts: Sequence[str | Sequence[int]], beam_width: int, max_tokens: int, *,
                    length_penalty: float = 1.0, early_stopping: bool | str = False,
                    ignore_eos: bool = False) -> list[RequestOutput]:
        """Beam search over each prompt (vLLM's `LLM.beam_search`): each output holds its `beam_width` finished
        sequences, best first, with their scores."""
        params = SamplingParams(temperature=0, max_tokens=max_tokens, beam_width=beam_width,
                                length_penalty=length_penalty, early_stopping=early_stopping, ignore_eos=ignore_eos)
        return self.generate(prompts, params)

    def close(self) -> None:
        if self.profiler is not None:
            self.profiler.close()
        if self.kv_connector is not None:
            self.kv_connector.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
