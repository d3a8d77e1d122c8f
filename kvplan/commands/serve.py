"""`kvplan serve`: an OpenAI-compatible server on the live engine — `/v1/completions` and `/v1/chat/completions`
(streamed over SSE or whole), `/v1/models`, `/health` and `/metrics` (Prometheus text, vLLM's metric names).
One engine loop steps continuously while requests arrive; a client that disconnects aborts its request; a full
queue answers 503 with Retry-After.

Prefill/decode disaggregation (vLLM's names): `--kv-transfer-config '{"kv_connector":"NixlConnector",
"kv_role":"kv_producer"}'` makes this instance hold the KV of requests sent with kv_transfer_params
{do_remote_decode: true} for a decode instance to read, `kv_consumer` makes it read a prefill instance's KV for
requests sent with the params that instance returned, `kv_both` does both (engine.kv_transfer.config);
`--pd-proxy --prefill URL[,URL] --decode URL[,URL]` runs the proxy that sends each request through a prefill and a
decode instance (engine.kv_transfer.proxy)."""

from __future__ import annotations

import argparse
from dataclasses import asdict

from kvplan.arg_types import integer, number
from kvplan.engine_args import add_engine_arguments, add_lora_modules, lora_modules_from_args, options_from_args
from kvplan.errors import UserError
from kvplan.output import short


def register(verbs: argparse._SubParsersAction) -> None:
    p = verbs.add_parser("serve", help="an OpenAI-compatible server on the live engine", description=__doc__)
    p.add_argument("--model", help="smollm2-135m, llama-100m, tiny-llama or a local HF directory (required, except "
                   "with --pd-proxy)")
    add_engine_arguments(p)
    add_lora_modules(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    p.add_argument("--port", type=integer(1, 65535), default=8000)
    p.add_argument("--served-model-name", default=None, help="the name clients pass as `model` (default: --model)")
    p.add_argument("--max-queue-len", type=integer(1, 1_000_000), default=1024,
                   help="requests waiting for admission before new ones get 503")
    p.add_argument("--seed", type=integer(0, 2**62), default=0, help="sampling seed of requests that give none")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    p.add_argument("--kv-transfer-config", default=None, metavar="JSON",
                   help="vLLM 0.34's KVTransferConfig as JSON: kv_connector NixlConnector or NixlPullConnector, "
                        "kv_role kv_producer|kv_consumer|kv_both, and its optional fields")
    pd = p.add_argument_group("prefill/decode proxy (instead of an engine)")
    pd.add_argument("--pd-proxy", action="store_true", help="run the P/D proxy: no model is loaded")
    pd.add_argument("--prefill", metavar="URL[,URL]", help="the prefill instances (round robin)")
    pd.add_argument("--decode", metavar="URL[,URL]", help="the decode instances (round robin)")
    pd.add_argument("--upstream-timeout", type=number(above=0, high=3600), default=30.0, metavar="S",
                    help="the longest wait for the next byte from an upstream instance: connecting, the prefill "
                         "answer, each chunk of the decode answer; past it the request fails with 502 (default 30)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.pd_proxy:
        return run_proxy(args)
    for flag in ("prefill", "decode"):
        if getattr(args, flag) is not None:
            raise UserError(f"--{flag}: only with --pd-proxy; allowed: leave it out, or add --pd-proxy")
    if args.model is None:
        raise UserError("--model: required (a built-in name or a local HF directory), except with --pd-proxy")
    from kvplan.engine.kv_transfer.config import parse_kv_transfer_config
    from kvplan.engine.llm import LLM
    from kvplan.engine.serving.server import serve

    options = options_from_args(args)
    lora_modules = lora_modules_from_args(args)
    transfer = None if args.kv_transfer_config is None else parse_kv_transfer_config(args.kv_transfer_config)
    check_listen(args.host, args.port)  # before the model loads; uvicorn would exit with its own log lines
    if transfer is not None and transfer.is_producer:  # where this instance serves its KV (loopback)
        check_listen("127.0.0.1", transfer.kv_port, "--kv-transfer-config: kv_port")
    llm = LLM(args.model, seed=args.seed, kv_transfer=transfer, lora_modules=lora_modules, **asdict(options))
    name = args.served_model_name or args.model
    layout = llm.kv_cache.layout
    print(f"kvplan serve: {name} ({options.dtype}, KV {llm.profile_meta['kv_dtype']}, block {options.block_size}, "
          f"{llm.num_kv_blocks} KV blocks of {layout.bytes_per_block} bytes, max_model_len {llm.max_model_len}) on "
          f"http://{args.host}:{args.port}", flush=True)
    if transfer is not None:
        print(f"kvplan serve: {transfer.kv_connector} ({transfer.semantics} semantics), {transfer.kv_role}"
              + (f", KV served on {server.host}:{server.port}"
                 if llm.kv_connector is not None and (server := llm.kv_connector.server) is not None else ""),
              flush=True)
    try:
        serve(llm, name, host=args.host, port=args.port, max_queue_len=args.max_queue_len,
              log_level=args.log_level)
    finally:
        llm.close()
    return 0


def run_proxy(args: argparse.Namespace) -> int:
    """`--pd-proxy`: no model; --prefill and --decode name the pools."""
    from kvplan.engine.kv_transfer.proxy import parse_urls, serve_proxy

    for flag in ("model", "kv_transfer_config"):
        if getattr(args, flag) is not None:
            raise UserError(f"--{flag.replace('_', '-')}: the proxy loads no model; allowed: leave it out with "
                            "--pd-proxy")
    pools = {}
    for flag in ("prefill", "decode"):
        if getattr(args, flag) is None:
            raise UserError(f"--{flag}: required with --pd-proxy; allowed: URL[,URL] of kvplan serve instances")
        pools[flag] = parse_urls(getattr(args, flag), f"--{flag}")
    check_listen(args.host, args.port)
    print(f"kvplan serve --pd-proxy: prefill {','.join(pools['prefill'])}, decode {','.join(pools['decode'])} on "
          f"http://{args.host}:{args.port}", flush=True)
    serve_proxy(pools["prefill"], pools["decode"], host=args.host, port=args.port, timeout_s=args.upstream_timeout,
                log_level=args.log_level)
    return 0


def check_listen(host: str, port: int, key: str = "--port") -> None:
    """The server can listen on host:port: the name resolves and the port is free (bound once here, then closed;
    uvicorn binds it again with the same SO_REUSEADDR)."""
    import socket

    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (socket.gaierror, UnicodeError) as exc:
        raise UserError(f"--host: {short(host)}: {getattr(exc, 'strerror', None) or exc}; allowed: an address or "
                        "name of this machine (default 127.0.0.1, 0.0.0.0 for every interface)") from None
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            raise UserError(f"{key}: cannot listen on {short(host)}:{port} ({exc.strerror}); allowed: a free port "
                            "on an address of this machine") from None
