"""The CPU side of serving with vLLM, measured: what the engine core's scheduler costs per step and per request,
and what the API server (vLLM's OpenAI front end) costs per request, per prompt token and per output token.

Every figure below is measured by scripts/measure_host_overhead.py, which times vLLM's own code from its wheel
(the version named in the block) on this machine's CPU and fits `a + b * x` to the timings; `--write` rewrites
the MEASURED block. What each constant is:

* `STEP_S`, `STEP_PER_SEQ_S`: vLLM's V1 `Scheduler.schedule()` + `update_from_output()` for a pure-decode step,
  as `STEP_S + STEP_PER_SEQ_S * running` (1 to 512 running requests, fake model outputs as the parity harness
  drives it). It runs on the engine core's process between two forward passes.
* `ADMIT_PER_REQUEST_S`: one more request admitted in a step: its `Request` built (the prompt's block hashes),
  `add_request`, and the scheduling of its 32-token prompt.
* `API_REQUEST_S`, `API_PROMPT_TOKEN_S`: the API server parsing a completion request's JSON body into vLLM's
  `CompletionRequest` and tokenizing the prompt (a Llama-class BPE tokenizer), as `a + b * prompt_tokens`.
* `API_STEP_S`, `API_OUTPUT_TOKEN_S`: the API server's work for one engine step's outputs, as `a + b * tokens`:
  vLLM's `OutputProcessor.process_outputs` (incremental detokenization, one `RequestOutput` per request) and one
  server-sent-events chunk per token (`CompletionStreamResponse` serialized).

Not measured here: the model runner's input preparation and sampling (they need the GPU model runner), the
HTTP/ASGI transport (sim.frontend takes it from a published client-vs-server measurement), and the ZMQ hop
between the API server and the engine core.

The CPU caveat. These are one core of this machine (an AMD EPYC server part, Python 3.11), the least-contended
of several interleaved rounds. A serving host's CPU (a DGX H100's Xeon 8480C, an HGX B200's Xeon 8570) is a
server core of the same class; single-thread Python speed differs between such parts by well under the 1.8x
run-to-run drift of this shared machine, so no scaling factor is applied (factor 1.0). A host with a slower core
scales every constant by its single-thread speed ratio (`scaled`).
"""

from __future__ import annotations

from dataclasses import dataclass

# MEASURED (begin)
# vLLM 0.34.0, Python 3.11.7, 15 rounds (scripts/measure_host_overhead.py --write)
STEP_S = 1.837e-05
STEP_PER_SEQ_S = 8.264e-06
ADMIT_PER_REQUEST_S = 3.232e-05
API_REQUEST_S = 2.593e-05
API_PROMPT_TOKEN_S = 1.144e-06
API_STEP_S = 1.193e-06
API_OUTPUT_TOKEN_S = 9.737e-06
# MEASURED (end)
SOURCE = ("measured: vLLM's own scheduler, output processor, request parsing and tokenizer on this machine's CPU "
          "(scripts/measure_host_overhead.py, kvplan/sim/gpu/host_overhead.py)")


@dataclass(slots=True, frozen=True)
class HostOverhead:
    """The measured constants as one record, scaled by a host's single-thread speed relative to the measuring
    machine (1.0: the same class of server core)."""

    step_s: float = STEP_S
    step_per_seq_s: float = STEP_PER_SEQ_S
    admit_per_request_s: float = ADMIT_PER_REQUEST_S
    api_request_s: float = API_REQUEST_S
    api_prompt_token_s: float = API_PROMPT_TOKEN_S
    api_step_s: float = API_STEP_S
    api_output_token_s: float = API_OUTPUT_TOKEN_S

    def engine_step_s(self, running: int, admitted: int = 0) -> float:
        """The engine core's CPU time for one step with `running` sequences, `admitted` of them new."""
        return self.step_s + self.step_per_seq_s * running + self.admit_per_request_s * admitted

    def scaled(self, slowdown: float) -> HostOverhead:
        """The same work on a host whose core takes `slowdown` times as long (> 1: slower)."""
        if not slowdown > 0:
            raise ValueError(f"slowdown must be > 0, got {slowdown!r}")
        return HostOverhead(*(getattr(self, name) * slowdown for name in self.__slots__))


HOST = HostOverhead()
