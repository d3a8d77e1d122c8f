"""`kvplan eval-ppl`: perplexity of a text under KV-cache policies - dense, window-only, sinks + window in both
position modes, each KV dtype - measured token by token through the engine's decode path with the bounded cache,
one row per policy.

    kvplan eval-ppl --model smollm2-135m --text /usr/share/common-licenses/GPL-3 --tokens 3000 \\
        --policy dense --policy window=256 --policy sinks=4,window=252 \\
        --policy sinks=4,window=252,positions=shifted --policy dense,kv=int8

A policy is `dense`, `window=W` or `sinks=S,window=W`, optionally with `,kv=DTYPE` (fp8_e4m3, int8, ...) and,
with a window, `,positions=shifted` (StreamingLLM: positions within the cache) or `,positions=original`."""

from __future__ import annotations

import argparse
from pathlib import Path

from kvplan.arg_types import BLOCK_SIZE, integer
from kvplan.engine_args import MODEL_DTYPES
from kvplan.output import format_table, print_json

DEFAULT_POLICIES = ("dense", "window=256", "sinks=4,window=252", "sinks=4,window=252,positions=shifted",
                    "dense,kv=fp8_e4m3", "dense,kv=int8")


def register(verbs: argparse._SubParsersAction) -> None:
    p = verbs.add_parser("eval-ppl", help="perplexity of a text under KV-cache policies", description=__doc__,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="smollm2-135m, llama-100m, tiny-llama or a local HF directory")
    p.add_argument("--text", type=Path, required=True, help="a UTF-8 text file (e.g. a licence the OS ships)")
    p.add_argument("--tokens", type=integer(2, 1_000_000), default=None,
                   help="score the text's first N tokens (default: all of it)")
    p.add_argument("--policy", action="append", default=None,
                   help=f"a cache policy (repeatable; default: {' '.join(DEFAULT_POLICIES)})")
    p.add_argument("--dtype", default="float32", choices=MODEL_DTYPES)
    p.add_argument("--block-size", type=BLOCK_SIZE, default=16)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=run)


def read_text(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"--text: {path}: not UTF-8 text (byte {exc.object[exc.start:exc.start + 1]!r} at offset "
                         f"{exc.start}); allowed: a UTF-8 text file") from None
    if not text.strip():
        raise ValueError(f"--text: {path}: empty; allowed: a text with at least 2 tokens")
    return text


def run(args: argparse.Namespace) -> int:
    from kvplan.engine.perplexity import parse_policy, perplexity

    policies = [parse_policy(p) for p in (args.policy or DEFAULT_POLICIES)]  # bad policies fail before any work
    text = read_text(args.text)
    tokens = _tokenize(args.model, text)
    if args.tokens is not None:
        if len(tokens) < args.tokens:
            raise ValueError(f"--tokens: {args.text} has {len(tokens)} tokens; allowed: at most that")
        tokens = tokens[:args.tokens]
    if len(tokens) < 2:
        raise ValueError(f"--text: {args.text}: {len(tokens)} token(s); allowed: at least 2")
    results = [perplexity(args.model, tokens, policy, dtype=args.dtype, block_size=args.block_size)
               for policy in policies]
    rows = [{"policy": r.policy.name, "sink_tokens": r.policy.sink_tokens, "window_tokens": r.policy.window_tokens,
             "kv_cache_dtype": r.policy.kv_cache_dtype, "position_mode": r.policy.position_mode, "tokens": r.tokens,
             "mean_nll": r.mean_nll,
             "perplexity": r.perplexity, "peak_blocks": r.peak_blocks, "block_bound": r.block_bound}
            for r in results]
    if args.json:
        print_json({"model": args.model, "text": str(args.text), "dtype": args.dtype, "block_size": args.block_size,
                    "policies": rows})
        return 0
    print(f"{args.text}: {len(tokens)} tokens, {args.model} ({args.dtype}), block {args.block_size}, scored token by "
          "token through the decode path\n")
    keys = ("policy", "kv_cache_dtype", "position_mode", "tokens", "mean_nll", "perplexity", "peak_blocks",
            "block_bound")
    print(format_table(list(keys), [[row[k] for k in keys] for row in rows]))
    return 0


def _tokenize(model: str, text: str) -> list[int]:
    from kvplan.engine.models import load_tokenizer

    tokenizer = load_tokenizer(model)
    if tokenizer is None:
        raise ValueError(f"--model: {model} has no tokenizer; allowed: a model with one (eval-ppl reads text)")
    return list(tokenizer.encode(text, add_special_tokens=False))
