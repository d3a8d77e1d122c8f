"""What `LLM.generate` and `LLM.step` return (vLLM-shaped)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvplan.engine.sampling import SampledToken


@dataclass(slots=True)
class RequestMetrics:
    arrival_s: float
    first_scheduled_s: float | None = None
    first_token_s: float | None = None
    finished_s: float | None = None
    token_times_s: list[float] = field(default_factory=list)  # when each output token of sequence 0 appeared
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    # P/D decode side (time.perf_counter()): when the request got its blocks and its KV pull began (the end of its
    # admission wait), and when the prefill side's KV had arrived (the end of the transfer)
    kv_load_start_s: float | None = None
    kv_load_end_s: float | None = None

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def e2e_s(self) -> float | None:
        return None if self.finished_s is None else self.finished_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first."""
        times = self.token_times_s
        return (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None

    def as_dict(self) -> dict[str, float | int | None]:
        return {"ttft_s": self.ttft_s, "tpot_s": self.tpot_s, "e2e_s": self.e2e_s,
                "queue_s": None if self.first_scheduled_s is None else self.first_scheduled_s - self.arrival_s,
                "num_cached_tokens": self.num_cached_tokens, "num_preemptions": self.num_preemptions}


@dataclass(slots=True)
class CompletionOutput:
    index: int
    token_ids: list[int]
    text: str | None
    finish_reason: str | None
    logprobs: list[SampledToken] | None = None
    cumulative_logprob: float | None = None  # beam search: sum of the tokens' log-probabilities
    score: float | None = None  # beam search: cumulative_logprob / len ** length_penalty (HF's sequences_scores)


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    metrics: RequestMetrics
    finished: bool = True
    teacher_logprobs: list[float] | None = None  # scoring requests: log p of each given continuation token
    kv_transfer_params: dict | None = None  # a remote-decode request: where a decode instance reads its KV
    error: str | None = None  # a request that failed (its KV never arrived): why; its finish_reason is "error"
