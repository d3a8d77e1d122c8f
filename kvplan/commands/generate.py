"""`kvplan generate`: run prompts through the live paged-KV engine and print the text and per-request metrics."""

from __future__ import annotations

import argparse
import sys

from kvplan.arg_types import FRACTION, NON_NEGATIVE, POSITIVE_TOKENS, SEED, integer, number
from kvplan.engine.core.settings import ON, Needs
from kvplan.engine_args import add_lora_modules, lora_modules_from_args
from kvplan.errors import UserError
from kvplan.settings_cli import add_setting_flags, check_flag_needs, settings_from_args

LORA_SETTINGS = ("enable_lora", "max_loras", "max_lora_rank", "max_cpu_loras")


def register(verbs: argparse._SubParsersAction) -> None:
    p = verbs.add_parser("generate", help="generate text with the live engine",
                         description="Generate with the paged-KV engine. MODEL is a local HF directory or a built-in "
                                     "name (smollm2-135m, tiny-llama, tiny-qwen2, tiny-gpt2, llama-100m).")
    p.add_argument("--model", required=True, help="local HF model directory or built-in name")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", action="append", help="a prompt (repeat for a batch); chat-templated when the "
                                                          "tokenizer has a chat template")
    source.add_argument("--prompt-ids", action="append", help="a prompt as space-separated token ids (repeatable)")
    p.add_argument("--raw", action="store_true", help="do not apply the chat template")
    p.add_argument("--n", type=integer(1, 1024), default=1, help="parallel samples per prompt")
    p.add_argument("--max-tokens", type=POSITIVE_TOKENS, default=64)
    p.add_argument("--temperature", type=number(low=0), default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=NON_NEGATIVE, default=0)
    p.add_argument("--top-p", type=FRACTION, default=1.0)
    p.add_argument("--seed", type=SEED, default=None)
    # vLLM's beam_width (LLM.beam_search, BeamSearchParams): at least one beam; no flag, no beam search. (HF's
    # num_beams=1 means greedy, kvplan's 0 meant off: both are spelled by leaving the flag out.)
    p.add_argument("--beam-width", type=integer(1, 64, "beams; leave the flag out for no beam search"), default=None,
                   help="beam search with this many beams (vLLM's beam_width; default: no beam search); prints "
                        "every beam's hypothesis, best first; needs the default sampling (--temperature 0, --n 1)")
    p.add_argument("--length-penalty", type=number(), default=None,
                   help="beam search: a hypothesis scores logprob sum / length ** this (default 1.0; needs "
                        "--beam-width)")
    # Its own defaults: float32, to answer as HF `generate` does on the same checkpoint (the bundled models are
    # float32; the serving commands run bfloat16), and 512 MiB of KV, to hold one prompt at the model's whole
    # context (SmolLM2's 8192 tokens in float32; the serving commands bound --max-model-len instead).
    add_setting_flags(p, "engine", names=("block_size", "kv_cache_memory", "dtype", "kv_cache_dtype", *LORA_SETTINGS),
                      defaults={"dtype": "float32", "kv_cache_memory": 512 << 20})
    add_lora_modules(p)
    p.add_argument("--lora", default=None, metavar="NAME", help="run every prompt with this adapter of "
                   "--lora-modules (default: the base model)")
    p.add_argument("--attention-backend", default=None, choices=["torch", "cpu", "triton"],
                   help="default: cpu (fused C++ decode) on CPU when it builds, else torch; triton on CUDA")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_setting_flags(p, "engine", names=("speculative_config",))  # (its acceptance rate goes to stderr)
    p.set_defaults(handler=_generate)


# Options of beam search: meaningless without it (engine.core.settings.Needs, as settings declare theirs).
BEAM_OPTIONS = {"length_penalty": Needs("beam search", (("beam_width", ON),))}
# Sampling options beam search replaces: (flag, attribute, the value beam search needs: the default).
NOT_WITH_BEAMS = (("--temperature", "temperature", 0.0), ("--top-k", "top_k", 0), ("--top-p", "top_p", 1.0),
                  ("--n", "n", 1))


def sampling_params(args: argparse.Namespace):  # -> SamplingParams
    """The sampling the flags ask for, checked before a model is loaded: beam options need --beam-width, and
    beam search is deterministic and returns its beams, so it leaves the sampling flags at their defaults."""
    check_flag_needs(args, vars(args), BEAM_OPTIONS)
    if args.beam_width is not None:
        for flag, name, needed in NOT_WITH_BEAMS:
            if getattr(args, name) != needed:
                raise UserError(f"argument {flag}: {getattr(args, name):g} with --beam-width; allowed: {flag} "
                                f"{needed:g} (beam search is deterministic and returns its beams: it needs "
                                f"{name}={needed:g}), or no --beam-width")
    from kvplan.engine.sampling import SamplingParams  # torch: imported once the flags are known to be usable

    penalty = 1.0 if args.length_penalty is None else args.length_penalty
    return SamplingParams(n=args.n, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                          max_tokens=args.max_tokens, seed=args.seed, beam_width=args.beam_width or 0,
                          length_penalty=penalty)


def _generate(args: argparse.Namespace) -> int:
    params = sampling_params(args)  # before torch and the model load: a bad combination is refused at once
    settings = settings_from_args(args, "engine")
    check_flag_needs(args, settings)
    lora_modules = lora_modules_from_args(args)
    if args.lora is not None and args.lora not in lora_modules:
        raise UserError(f"argument --lora: {args.lora!r} is not an adapter of --lora-modules; allowed: "
                        f"{', '.join(lora_modules) or 'none given (--enable-lora --lora-modules NAME=PATH)'}")
    from kvplan.engine.llm import LLM
    from kvplan.output import print_json

    llm = LLM(args.model, attention_backend=args.attention_backend, lora_modules=lora_modules, **settings)
    if args.prompt_ids:
        prompts = [_parse_ids(text) for text in args.prompt_ids]
    else:
        prompts = [_templated(llm, text, args.raw) for text in args.prompt]
    outputs = llm.generate(prompts, params, lora=args.lora)
    report = {"model": args.model, **({"lora": args.lora} if args.lora else {}),
              "kv_blocks": llm.num_kv_blocks, "kv_dtype": llm.profile_meta["kv_dtype"],
              "kv_bytes_per_block": llm.kv_cache.layout.bytes_per_block, "block_size": args.block_size, "requests": [
        {"request_id": o.request_id, "prompt": o.prompt if o.prompt is not None else o.prompt_token_ids,
         "outputs": [{"index": c.index, "text": c.text, "token_ids": c.token_ids, "finish_reason": c.finish_reason,
                      **({"score": c.score} if c.score is not None else {})} for c in o.outputs],
         "metrics": o.metrics.as_dict()} for o in outputs]}
    if llm.spec is not None:  # on stderr: stdout stays what the same command without speculation prints
        print(spec_summary(llm.spec_stats), file=sys.stderr)
    if args.json:
        print_json(report)
        return 0
    print(f"model {args.model}: {llm.num_kv_blocks} KV blocks of {args.block_size} tokens "
          f"({report['kv_dtype']}, {report['kv_bytes_per_block']} bytes each)")
    for request in report["requests"]:
        for completion in request["outputs"]:
            shown = completion["text"] if completion["text"] is not None else completion["token_ids"]
            score = f" score={completion['score']:.4f}" if "score" in completion else ""
            print(f"\n[{request['request_id']}.{completion['index']}] ({completion['finish_reason']}{score}) {shown}")
        m = request["metrics"]
        print("  " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in m.items()))
    return 0


def spec_summary(stats: dict) -> str:
    """One line on speculative decoding's acceptance (`LLM.spec_stats`)."""
    rate, length = stats["acceptance_rate"], stats["mean_acceptance_length"]
    return (f"speculative decoding: acceptance rate {'n/a' if rate is None else f'{rate:.3f}'} "
            f"({stats['num_accepted_tokens']} of {stats['num_draft_tokens']} drafts accepted in "
            f"{stats['num_drafts']} verifications; mean acceptance length "
            f"{'n/a' if length is None else f'{length:.3f}'}; accepted per position "
            f"{stats['num_accepted_tokens_per_pos']})")


def _parse_ids(text: str) -> list[int]:
    try:
        return [int(t) for t in text.split()]
    except ValueError:
        raise UserError(f"--prompt-ids: expected space-separated integers, got {text!r}") from None


def _templated(llm, text: str, raw: bool) -> str | list[int]:
    tokenizer = llm.tokenizer
    if raw or tokenizer is None or not getattr(tokenizer, "chat_template", None):
        return text
    return list(tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                              tokenize=True, return_dict=False))
