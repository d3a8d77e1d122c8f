"""OpenAI request bodies → engine requests, and the response objects, for `/v1/completions` and
`/v1/chat/completions`.

Accepted as OpenAI and vLLM accept them: a completion prompt is a string, a list of token ids, or a list of
either (a batch: choice i·n + j is prompt i's j-th sample); chat messages go through the tokenizer's chat
template. vLLM's extensions are honoured: `top_k`, `ignore_eos`, `stop_token_ids`, `min_tokens` = 0 only, and
`return_token_ids` (each choice also carries its token ids). What the engine cannot do is refused with a 400
naming the field (`logprobs`, `echo`, penalties, `best_of` ≠ n, `suffix`, vLLM's `min_p`, beam search, guided
decoding), and so is a field it does not know: never silently ignored.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.engine.sampling import SamplingParams
from kvplan.errors import UserError


class BadRequest(UserError):
    """A request the server answers with 400 (or `status`) and an OpenAI-style error body."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.param, self.status = param, status

    def body(self) -> dict:
        kind = {400: "invalid_request_error", 404: "not_found_error", 503: "service_unavailable"}.get(
            self.status, "server_error")
        return {"error": {"message": str(self), "type": kind, "param": self.param, "code": self.status}}


@dataclass(slots=True)
class ParsedRequest:
    prompts: list[list[int]]  # token ids, one entry per prompt
    params: SamplingParams
    stream: bool
    include_usage: bool
    return_token_ids: bool
    stop: tuple[str, ...]  # stop strings: the text is cut before the first one and the sequence ends
    kv_transfer_params: dict | None = None  # vLLM's P/D fields (engine.kv_transfer.producer reads them)
    lora: str | None = None  # the LoRA adapter the request's `model` names (None: the base model)


def _number(body: dict, key: str, default: float, low: float, high: float) -> float:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise BadRequest(f"{key}: must be a number in [{low}, {high}], got {value!r}", key)
    return float(value)


def _integer(body: dict, key: str, default: int | None, low: int, high: int) -> int | None:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise BadRequest(f"{key}: must be an integer in [{low}, {high}], got {value!r}", key)
    return value


def _flag(body: dict, key: str) -> bool:
    value = body.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise BadRequest(f"{key}: must be true or false, got {value!r}", key)
    return value


# fields the engine cannot honour -> the values that ask for nothing (anything else gets a 400): OpenAI's, then
# vLLM's sampling extensions (a client that sends min_p 0.1 must not get an answer sampled without it)
_NEUTRAL = {"logprobs": (None, False, 0), "top_logprobs": (None, 0), "echo": (None, False), "suffix": (None, ""),
            "presence_penalty": (None, 0), "frequency_penalty": (None, 0), "repetition_penalty": (None, 1),
            "min_tokens": (None, 0), "logit_bias": (None, {}), "tools": (None, []), "tool_choice": (None, "none"),
            "response_format": (None, {"type": "text"}), "min_p": (None, 0), "use_beam_search": (None, False),
            "length_penalty": (None, 1), "early_stopping": (None, False), "include_stop_str_in_output": (None, False),
            "guided_json": (None,), "guided_regex": (None,), "guided_choice": (None,), "guided_grammar": (None,),
            "guided_decoding_backend": (None,), "guided_whitespace_pattern": (None,), "structured_outputs": (None,),
            "guided_decoding": (None,), "prompt_logprobs": (None,), "allowed_token_ids": (None,),
            "bad_words": (None, []), "truncate_prompt_tokens": (None,), "skip_special_tokens": (None, True),
            "spaces_between_special_tokens": (None, True), "add_generation_prompt": (None, True),
            "continue_final_message": (None, False), "chat_template": (None,), "chat_template_kwargs": (None, {}),
            "documents": (None,), "priority": (None, 0), "parallel_tool_calls": (None, True, False),
            "lora_request": (None,)}
# fields read by parse_common, completion_prompts or chat_prompt, and those that never change an answer
_HONOURED = ("model", "prompt", "messages", "n", "best_of", "max_tokens", "max_completion_tokens", "temperature",
             "top_p", "top_k", "seed", "stop", "stop_token_ids", "ignore_eos", "stream", "stream_options",
             "return_token_ids", "user", "metadata", "store", "request_id", "service_tier", "kv_transfer_params")


def _same(value: object, neutral: object) -> bool:
    """`value` asks for what `neutral` asks for: 0.0 is 0, but True is not 1 (== alone would say it is)."""
    if isinstance(value, bool) or isinstance(neutral, bool) or value is None or neutral is None:
        return value is neutral
    return value == neutral


def _unsupported(body: dict) -> None:
    for key, value in body.items():
        if key in _NEUTRAL:
            if not any(_same(value, v) for v in _NEUTRAL[key]):
                raise BadRequest(f"{key}: not supported by kvplan serve (got {_short(value)})", key)
        elif key not in _HONOURED:
            raise BadRequest(f"{_short(key)}: not a field kvplan serve knows, so it cannot be honoured; allowed: "
                             f"{', '.join(_HONOURED)} (and {', '.join(sorted(_NEUTRAL))} at their neutral values)",
                             str(key)[:60])


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > 16:
        raise BadRequest(f"stop: a non-empty string or a list of at most 16 of them, got {stop!r}", "stop")
    return tuple(stops)


def parse_common(body: dict, prompts: list[list[int]], default_max_tokens: int, max_model_len: int,
                 vocab_size: int) -> ParsedRequest:
    """The sampling fields shared by both endpoints."""
    _unsupported(body)
    n = _integer(body, "n", 1, 1, 128)
    best_of = _integer(body, "best_of", n, 1, 128)
    if best_of != n:
        raise BadRequest(f"best_of: must equal n ({n}); kvplan serve returns every sample, got {best_of}", "best_of")
    max_tokens = _integer(body, "max_tokens", None, 1, max_model_len)
    if max_tokens is None:
        max_tokens = _integer(body, "max_completion_tokens", default_max_tokens, 1, max_model_len)
    stop_ids = body.get("stop_token_ids") or []
    if not isinstance(stop_ids, list) or not all(isinstance(t, int) and 0 <= t < vocab_size for t in stop_ids):
        raise BadRequest(f"stop_token_ids: a list of token ids in [0, {vocab_size}), got {stop_ids!r}",
                         "stop_token_ids")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise BadRequest(f"stream_options: an object, got {options!r}", "stream_options")
    params = SamplingParams(
        n=n, temperature=_number(body, "temperature", 1.0, 0.0, 2.0), top_p=_number(body, "top_p", 1.0, 1e-9, 1.0),
        top_k=max(0, _integer(body, "top_k", 0, -1, vocab_size)), max_tokens=max_tokens,
        seed=_integer(body, "seed", None, 0, 2**62), stop_token_ids=tuple(stop_ids),
        ignore_eos=_flag(body, "ignore_eos"))
    transfer = body.get("kv_transfer_params")
    if transfer is not None and not isinstance(transfer, dict):
        raise BadRequest(f"kv_transfer_params: an object, got {_short(transfer)}", "kv_transfer_params")
    return ParsedRequest(prompts, params, _flag(body, "stream"), _flag(options, "include_usage"),
                         _flag(body, "return_token_ids"), _stop(body), transfer)


def completion_prompts(body: dict, encode, vocab_size: int) -> list[list[int]]:
    """`prompt`: a string, token ids, or a non-empty list of either."""
    prompt = body.get("prompt")
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and all(_is_token(t) for t in prompt)):
        prompt = [prompt]
    if not isinstance(prompt, list) or not prompt:
        raise BadRequest("prompt: a string, a list of token ids, or a non-empty list of strings or of token-id "
                         f"lists; got {_short(body.get('prompt'))}", "prompt")
    out = []
    for i, item in enumerate(prompt):
        if isinstance(item, str):
            try:
                out.append(encode(item))
            except ValueError as exc:  # a model without a tokenizer takes token ids only
                raise BadRequest(f"prompt[{i}]: {exc}", "prompt") from None
        elif isinstance(item, list) and item and all(_is_token(t) for t in item):
            out.append(list(item))
        else:
            raise BadRequest(f"prompt[{i}]: a string or a non-empty list of token ids, got {_short(item)}", "prompt")
        if not out[-1]:
            raise BadRequest(f"prompt[{i}]: empty after tokenization", "prompt")
        if max(out[-1]) >= vocab_size:
            raise BadRequest(f"prompt[{i}]: token ids must lie in [0, {vocab_size}), got {max(out[-1])}", "prompt")
    return out


def chat_prompt(body: dict, tokenizer) -> list[int]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest(f"messages: a non-empty list of {{role, content}} objects, got {_short(messages)}",
                         "messages")
    plain = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ("system", "user", "assistant", "developer"):
            raise BadRequest(f"messages[{i}]: an object with role system, user, assistant or developer", "messages")
        content = message.get("content")
        if isinstance(content, list):  # content parts: only text can reach a text model
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise BadRequest(f"messages[{i}].content: only text parts are supported", "messages")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise BadRequest(f"messages[{i}].content: a string or a list of text parts", "messages")
        plain.append({"role": "system" if message["role"] == "developer" else message["role"], "content": content})
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise BadRequest("this model has no chat template: use /v1/completions", "messages")
    return list(tokenizer.apply_chat_template(plain, add_generation_prompt=True, tokenize=True, return_dict=False))


def _is_token(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
