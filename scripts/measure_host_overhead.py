"""Measure the CPU side of serving with vLLM's own code, on this machine, and fit the constants of
kvplan/sim/gpu/host_overhead.py.

What is timed (vLLM's installed wheel, its pure-Python parts; no GPU and no model weights):

* engine core, per step: vLLM's V1 `Scheduler.schedule()` + `update_from_output()` driven with fake model-runner
  outputs (one sampled token per finished chunk, as tests/core/vllm_parity.py drives it), for pure-decode batches
  of B running requests, and for steps that admit k new requests beside 64 decodes (per admitted request: its
  `Request` built with the prompt's block hashes, `add_request`, and the step scheduling its 32-token prompt);
* the API server (vLLM's OpenAI front end, one process), per request: parsing the JSON body into vLLM's
  `CompletionRequest` and tokenizing the prompt with the model's tokenizer (SmolLM2-135M's, the one tokenizer
  kept on this machine; a Llama-3-class BPE tokenizer of the same kind) vs prompt length;
* the API server, per output token: vLLM's `OutputProcessor.process_outputs` (incremental detokenization and a
  `RequestOutput` per request) for a step's batch of B tokens, plus one SSE chunk per token
  (`CompletionStreamResponse.model_dump_json`, as `serving_completion` streams it).

Each point is timed in interleaved rounds (a round takes every point once; within a round a point is the median
of 5-30 repeats). This 2-core machine is shared and its speed drifts ~1.8x between 10 s windows, always towards
slower: the least-contended round (the minimum over rounds) is kept as the machine's own speed, then the points
are fitted by least squares to `a + b * x`.

Run (vLLM's wheel and its pure-Python imports on the path, as scripts/vllm_parity.sh installs them):

    PYTHONPATH=.:/path/to/vllm-site .venv/bin/python scripts/measure_host_overhead.py [--rounds 7] [--write]

`--write` rewrites the MEASURED block of kvplan/sim/gpu/host_overhead.py; prints one JSON object either way.
`--serve MODEL` also replays a small trace against `kvplan serve --model MODEL` on this CPU and fits the API
server's transport latency from its clients' TTFT against its own /metrics (endpoint.frontend_fit).
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from kvplan.sim.frontend import PUBLISHED_OVERHEAD_S, PUBLISHED_PROMPT_TOKENS

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "core"))  # vLLM's scheduler, built the way the parity harness builds it
TOKENIZER = Path.home() / ".cache" / "kvplan" / "models" / "smollm2-135m"
DECODE_BATCHES = (1, 8, 32, 64, 128, 256, 512)
ADMITTED = (1, 4, 16, 32)
PROMPTS = (16, 128, 512, 2048)
PROMPT_LEN = 32


def median_ns(fn, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        fn()
        samples.append(time.perf_counter_ns() - t0)
    return float(statistics.median(samples))


# -- engine core -------------------------------------------------------------------------------------------------
class VllmEngineCore:
    """vLLM's scheduler with every request decoding (long max_tokens), stepped with fake outputs."""

    INDEXED = False  # whether this vLLM's ModelRunnerOutput still takes req_id_to_index (set in engine_core_points)

    def __init__(self, running: int) -> None:
        from vllm_parity import Scenario, VllmSide

        self.scenario = Scenario(seed=0, block_size=16, num_blocks=running * 64 + 4096, max_num_batched_tokens=8192,
                                 max_num_seqs=max(running, 1) + max(ADMITTED), enable_chunked_prefill=True,
                                 enable_prefix_caching=True, watermark_blocks=0, reserve_full_isl=True,
                                 max_model_len=4096)
        self.side = VllmSide(self.scenario)
        self.count = 0
        self.add(running)
        while any(self.side.sched.requests[r].num_computed_tokens < PROMPT_LEN for r in self.side.sched.requests):
            self.step()

    def add(self, k: int) -> None:
        from vllm_parity import Arrival

        for _ in range(k):
            self.count += 1
            rid = f"r{self.count}"
            prompt = [(self.count * 7919 + i) % 997 + 1 for i in range(PROMPT_LEN)]  # distinct: no prefix hits
            self.side.add(Arrival(rid, 0, prompt, 2048))

    def outputs(self, out):
        from vllm.v1.outputs import ModelRunnerOutput

        sched = self.side.sched
        ids = list(out.num_scheduled_tokens)
        sampled = [[1] if sched.requests[r].num_computed_tokens >= sched.requests[r].num_tokens else [] for r in ids]
        index = {"req_id_to_index": {r: i for i, r in enumerate(ids)}} if self.INDEXED else {}
        return ModelRunnerOutput(req_ids=ids, sampled_token_ids=sampled, **index)

    def step(self) -> int:
        """One step; returns the nanoseconds of schedule() + update_from_output() (the fake output excluded)."""
        sched = self.side.sched
        t0 = time.perf_counter_ns()
        out = sched.schedule()
        t1 = time.perf_counter_ns()
        fake = self.outputs(out)
        t2 = time.perf_counter_ns()
        sched.update_from_output(out, fake)
        return (t1 - t0) + (time.perf_counter_ns() - t2)


def engine_core_points(rounds: int) -> dict:
    from dataclasses import fields

    from vllm.v1.outputs import ModelRunnerOutput

    VllmEngineCore.INDEXED = "req_id_to_index" in {f.name for f in fields(ModelRunnerOutput)}
    cores = {b: VllmEngineCore(b) for b in DECODE_BATCHES}
    admit_cores = {k: VllmEngineCore(64) for k in ADMITTED}
    decode: dict[int, list[float]] = {b: [] for b in DECODE_BATCHES}
    admit: dict[int, list[float]] = {k: [] for k in ADMITTED}
    base: list[float] = []
    for _ in range(rounds):
        for b, core in cores.items():
            decode[b].append(float(statistics.median(core.step() for _ in range(20))))
        for k, core in admit_cores.items():
            base.append(float(statistics.median(core.step() for _ in range(5))))
            samples = []
            for _ in range(5):
                t0 = time.perf_counter_ns()
                core.add(k)  # Request construction (block hashes of the prompt) + add_request, in the engine core
                added = time.perf_counter_ns() - t0
                samples.append(added + core.step())  # the step that admits them (their whole 32-token prompts)
            admit[k].append(float(statistics.median(samples)))
    # k = 0: the same cores' pure-decode steps of 64, so that the slope over k is the cost of one admission
    return {"decode": {b: min(v) for b, v in decode.items()},
            "admit": {0: min(base), **{k: min(v) for k, v in admit.items()}}}


# -- API server ----------------------------------------------------------------------------------------------------
def api_request_points(rounds: int) -> dict:
    """ns to parse a completion request body and tokenize its prompt, per prompt length (tokens)."""
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.tokenizers.registry import get_tokenizer

    tokenizer = get_tokenizer(str(TOKENIZER))
    words = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "seven", "wizards",
             "quietly", "hex", "jolly", "bankers"]
    texts = {}
    for n in PROMPTS:
        text, i = "", 0
        while len(tokenizer.encode(text)) < n:
            text += words[i % len(words)] + " "
            i += 1
        texts[n] = text
    bodies = {n: json.dumps({"model": "m", "prompt": texts[n], "max_tokens": 128, "stream": True,
                             "temperature": 0.0}) for n in PROMPTS}
    tokens = {n: len(tokenizer.encode(texts[n])) for n in PROMPTS}

    def handle(n: int) -> None:
        request = CompletionRequest.model_validate_json(bodies[n])
        tokenizer.encode(request.prompt)

    points: dict[int, list[float]] = {n: [] for n in PROMPTS}
    for _ in range(rounds):
        for n in PROMPTS:
            points[n].append(median_ns(lambda n=n: handle(n), 30))
    return {"tokens": tokens, "ns": {n: min(v) for n, v in points.items()}}


class VllmOutputSide:
    """vLLM's OutputProcessor holding B streaming requests; a step hands it one new token per request and each
    request's delta is serialized as one SSE chunk of a completion stream."""

    def __init__(self, batch: int, tokenizer) -> None:
        from vllm.sampling_params import RequestOutputKind, SamplingParams
        from vllm.v1.engine import EngineCoreRequest
        from vllm.v1.engine.output_processor import OutputProcessor, RequestOutputCollector

        self.processor = OutputProcessor(tokenizer, log_stats=False)
        self.ids = [f"o{i}" for i in range(batch)]
        self.queues = {}
        params = SamplingParams(max_tokens=1 << 20, ignore_eos=True, output_kind=RequestOutputKind.DELTA)
        for rid in self.ids:
            request = EngineCoreRequest(request_id=rid, prompt_token_ids=np.arange(1, 33, dtype=np.int32),
                                        mm_features=None, sampling_params=params, pooling_params=None,
                                        arrival_time=time.time(), lora_request=None, cache_salt=None,
                                        data_parallel_rank=None, external_req_id=rid)
            self.queues[rid] = RequestOutputCollector(RequestOutputKind.DELTA, rid)
            self.processor.add_request(request, None, None, 0, self.queues[rid])
        self.step_index = 0

    def step(self) -> tuple[int, int]:
        """(ns in process_outputs, ns serializing the batch's SSE chunks)."""
        from vllm.entrypoints.openai.completion.protocol import (
            CompletionResponseStreamChoice,
            CompletionStreamResponse,
        )
        from vllm.v1.engine import EngineCoreOutput

        self.step_index += 1
        token = 300 + self.step_index % 5000  # ordinary word pieces of the vocabulary
        outputs = [EngineCoreOutput(request_id=rid, new_token_ids=[token]) for rid in self.ids]
        t0 = time.perf_counter_ns()
        self.processor.process_outputs(outputs)
        t1 = time.perf_counter_ns()
        for rid in self.ids:
            delta = self.queues[rid].get_nowait()
            text = delta.outputs[0].text if delta is not None else ""
            chunk = CompletionStreamResponse(id=rid, created=0, model="m",
                                             choices=[CompletionResponseStreamChoice(index=0, text=text)])
            f"data: {chunk.model_dump_json(exclude_unset=False)}\n\n".encode()
        return t1 - t0, time.perf_counter_ns() - t1


def output_points(rounds: int) -> dict:
    from vllm.tokenizers.registry import get_tokenizer

    tokenizer = get_tokenizer(str(TOKENIZER))
    sides = {b: VllmOutputSide(b, tokenizer) for b in DECODE_BATCHES}
    detok: dict[int, list[float]] = {b: [] for b in DECODE_BATCHES}
    sse: dict[int, list[float]] = {b: [] for b in DECODE_BATCHES}
    for _ in range(rounds):
        for b, side in sides.items():
            pairs = [side.step() for _ in range(10)]
            detok[b].append(float(statistics.median(p[0] for p in pairs)))
            sse[b].append(float(statistics.median(p[1] for p in pairs)))
    return {"process_outputs": {b: min(v) for b, v in detok.items()}, "sse": {b: min(v) for b, v in sse.items()}}


# -- kvplan serve: the HTTP transport -----------------------------------------------------------------------------
SERVE_TRACE = {"seed": 5, "requests": 24, "arrivals": {"process": "poisson", "rate": 0.4},
               "lengths": {"prompt": {"dist": "uniform", "min": 64, "max": 512},
                           "output": {"dist": "uniform", "min": 4, "max": 16}}}


def serve_fit(model: str) -> dict:
    """`kvplan serve` on this CPU, replayed at a low rate (no queue) through kvplan's load generator: the clients'
    TTFT against the server's own `vllm:time_to_first_token_seconds` (stamped after parsing and tokenizing), the
    front end's latency fitted by endpoint.frontend_fit - the path `validate --endpoint` takes."""
    import tempfile

    from kvplan.endpoint.frontend_fit import fit_latency
    from kvplan.endpoint.local_server import server_process
    from kvplan.endpoint.session import EndpointOptions, replay_endpoint
    from kvplan.traces.synth import synthesize

    trace = synthesize(SERVE_TRACE)
    engine = ["--max-num-seqs", "8", "--max-model-len", "1024"]
    with server_process(model, engine) as url, tempfile.TemporaryDirectory() as out:
        options = EndpointOptions(url=url, model=None, vocab_size=None, tokenizer=None, max_concurrency=None,
                                  duration_s=None, timeout_s=120.0, reset_prefix_cache=False)
        live, _ = replay_endpoint(options, trace, seed=0, temperature=0.0, out=Path(out), sample_interval_s=1.0)
    first = live.requests[live.requests["sample"] == 0]
    fit = fit_latency(first["ttft_ms"].to_numpy(), first["prompt_tokens"].to_numpy(), live.info["server_counters"])
    if fit is None:
        raise SystemExit("kvplan serve exposed no TTFT histogram")
    return {"model": model, **fit.to_json()}


# -- fitting -------------------------------------------------------------------------------------------------------
def fit(xs: list[float], ns: list[float]) -> dict:
    """Least squares `seconds = a + b * x` on relative errors (each point weighted by 1 / its time, so that the
    small batches, where the intercept shows, count as much as the large ones), with the largest relative
    residual."""
    x, y = np.asarray(xs, dtype=float), np.asarray(ns, dtype=float) / 1e9
    b, a = np.polyfit(x, y, 1, w=1.0 / y)
    worst = float(np.max(np.abs((a + b * x) - y) / y))
    return {"intercept_s": float(a), "slope_s": float(b), "max_rel_residual": round(worst, 3),
            "points": {str(int(k)): round(float(v) * 1e6, 2) for k, v in zip(xs, y, strict=True)}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (median over them)")
    parser.add_argument("--write", action="store_true", help="rewrite the MEASURED block of host_overhead.py")
    parser.add_argument("--serve", metavar="MODEL", default=None,
                        help="also fit the API server's transport latency on `kvplan serve --model MODEL`")
    args = parser.parse_args()
    import vllm

    core = engine_core_points(args.rounds)
    api = api_request_points(args.rounds)
    out = output_points(args.rounds)
    decode = fit(list(core["decode"]), list(core["decode"].values()))
    admit = fit(list(core["admit"]), list(core["admit"].values()))
    request = fit([api["tokens"][n] for n in PROMPTS], list(api["ns"].values()))
    detok = fit(list(out["process_outputs"]), list(out["process_outputs"].values()))
    sse = fit(list(out["sse"]), list(out["sse"].values()))
    measured = {
        "vllm_version": vllm.__version__, "python": platform.python_version(), "cpu": platform.processor()
        or platform.machine(), "rounds": args.rounds,
        "step_s": decode["intercept_s"], "step_per_seq_s": decode["slope_s"],
        "admit_per_request_s": admit["slope_s"],
        "api_request_s": request["intercept_s"], "api_prompt_token_s": request["slope_s"],
        "api_step_s": detok["intercept_s"] + sse["intercept_s"],
        "api_output_token_s": detok["slope_s"] + sse["slope_s"],
        "fits": {"engine_decode_step_vs_batch": decode, "engine_admit_vs_requests": admit,
                 "api_request_vs_prompt_tokens": request, "api_process_outputs_vs_batch": detok,
                 "api_sse_vs_batch": sse},
        "serve_fit": serve_fit(args.serve) if args.serve is not None else None,
    }
    print(json.dumps(measured, indent=1))
    if args.write:
        write_module(measured)
        write_docs(measured)
    return 0


DOC_FITS = (("engine_decode_step_vs_batch", "engine core: schedule + update of a pure-decode step", "running"),
            ("engine_admit_vs_requests", "engine core: a step admitting k new requests beside 64 decodes", "k"),
            ("api_request_vs_prompt_tokens", "API server: parse the request, tokenize the prompt", "prompt tokens"),
            ("api_process_outputs_vs_batch", "API server: detokenize a step's outputs (OutputProcessor)", "batch"),
            ("api_sse_vs_batch", "API server: one SSE chunk per token", "batch"))


def default_latency_s(measured: dict) -> float:
    """sim.frontend's default transport latency with these constants: the published overhead less the work."""
    return (PUBLISHED_OVERHEAD_S - measured["api_request_s"] - measured["api_prompt_token_s"] * PUBLISHED_PROMPT_TOKENS
            - measured["api_output_token_s"])


def write_docs(measured: dict) -> None:
    """docs/host_overhead.md: the method, every point timed, the fits and where each constant is used."""
    lines = ["# The CPU side of a vLLM server, measured", "",
             "Generated by `scripts/measure_host_overhead.py --write` (do not edit): vLLM "
             f"{measured['vllm_version']}'s own code timed on this machine's CPU (Python {measured['python']}, "
             f"the least-contended of {measured['rounds']} interleaved rounds), fitted to `a + b * x`. The constants "
             "are in `kvplan/sim/gpu/host_overhead.py`; the method and the CPU caveat are in its docstring.", "",
             "| what is timed | x | points (x: µs) | a (µs) | b (µs per x) | worst residual |",
             "|---|---|---|---|---|---|"]
    for key, what, x in DOC_FITS:
        f = measured["fits"][key]
        points = ", ".join(f"{k}: {v:g}" for k, v in f["points"].items())
        lines.append(f"| {what} | {x} | {points} | {f['intercept_s'] * 1e6:.1f} | {f['slope_s'] * 1e6:.2f} | "
                     f"{f['max_rel_residual']:.0%} |")
    lines += ["", "Where they are used:", "",
              "- `sim.frontend.FrontendCost`: `request_s`, `prompt_token_s` (the API server's work before the engine "
              "sees a request) and `output_token_s` (detokenization + SSE per token); its `latency_s` comes from a "
              "published client-vs-server TTFT of `vllm serve` (vLLM PR #54628), less that work.",
              "- the engine core's per-step and per-request CPU time (`HostOverhead.engine_step_s`): vLLM 0.34 "
              "schedules asynchronously by default (`async_scheduling` None -> True), so this CPU time overlaps the "
              "GPU's forward pass and a step takes the longer of the two.", ""]
    fit = measured.get("serve_fit")
    if fit is not None:
        lines += ["The same fit `validate --endpoint` makes (`kvplan.endpoint.frontend_fit`), on `kvplan serve --model "
                  f"{fit['model']}` on this CPU ({fit['requests']} requests at a low rate): clients' mean TTFT "
                  f"{fit['client_mean_ttft_ms']:.1f} ms against the server's {fit['engine_mean_ttft_ms']:.1f} ms "
                  f"({fit['engine_source']}): {fit['added_ttft_ms']:.1f} ms added, of which "
                  f"{fit['work_ms']:.2f} ms is the priced API-server work, so a transport latency of "
                  f"{fit['latency_s'] * 1e3:.1f} ms (the simulator's default for vLLM: "
                  f"{default_latency_s(measured) * 1e3:.1f} ms). kvplan serve's engine loop shares its process with "
                  "the HTTP server, so this also holds the engine loop's interference.", ""]
    (ROOT / "docs" / "host_overhead.md").write_text("\n".join(lines))


def write_module(measured: dict) -> None:
    """Replace the block between the MEASURED markers of host_overhead.py with these figures."""
    path = ROOT / "kvplan" / "sim" / "gpu" / "host_overhead.py"
    keys = ("step_s", "step_per_seq_s", "admit_per_request_s", "api_request_s", "api_prompt_token_s", "api_step_s",
            "api_output_token_s")
    lines = [f"# vLLM {measured['vllm_version']}, Python {measured['python']}, {measured['rounds']} rounds "
             "(scripts/measure_host_overhead.py --write)",
             *(f"{key.upper()} = {measured[key]:.4g}" for key in keys)]
    text = path.read_text()
    block = "# MEASURED (begin)\n" + "\n".join(lines) + "\n# MEASURED (end)"
    path.write_text(re.sub(r"# MEASURED \(begin\)\n.*?# MEASURED \(end\)", lambda _: block, text, flags=re.S))


if __name__ == "__main__":
    raise SystemExit(main())
