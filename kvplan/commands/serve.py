"""`kvplan serve`: an OpenAI-compatible server on the live engine — `/v1/completions` and `/v1/chat/completions`
(streamed over SSE or whole), `/v1/models`, `/health` and `/metrics` (Prometheus text, vLLM's metric names).
One engine loop steps continuously while requests arrive; a client that disconnects aborts its request; a full
queue answers 503 with Retry-After."""

from __future__ import annotations

import argparse

from kvplan.arg_types import integer
from kvplan.engine_args import add_engine_arguments, options_from_args


def register(verbs: argparse._SubParsersAction) -> None:
    p = verbs.add_parser("serve", help="an OpenAI-compatible server on the live engine", description=__doc__)
    p.add_argument("--model", required=True, help="smollm2-135m, llama-100m, tiny-llama or a local HF directory")
    add_engine_arguments(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    p.add_argument("--port", type=integer(1, 65535), default=8000)
    p.add_argument("--served-model-name", default=None, help="the name clients pass as `model` (default: --model)")
    p.add_argument("--max-queue-len", type=integer(1, 1_000_000), default=1024,
                   help="requests waiting for admission before new ones get 503")
    p.add_argument("--seed", type=integer(0, 2**62), default=0, help="sampling seed of requests that give none")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from kvplan.engine.llm import LLM
    from kvplan.engine.serving.server import serve

    options = options_from_args(args)
    llm = LLM(args.model, seed=args.seed, **options.llm_kwargs())
    name = args.served_model_name or args.model
    layout = llm.kv_cache.layout
    print(f"kvplan serve: {name} ({options.dtype}, KV {llm.profile_meta['kv_dtype']}, block {options.block_size}, "
          f"{llm.num_kv_blocks} KV blocks of {layout.bytes_per_block} bytes, max_model_len {llm.max_model_len}) on "
          f"http://{args.host}:{args.port}", flush=True)
    serve(llm, name, host=args.host, port=args.port, max_queue_len=args.max_queue_len, log_level=args.log_level)
    return 0
