"""Prompts for an endpoint replay: each trace row becomes a prompt of its length that shares exactly the trace's
prefixes with other rows.

Token ids come from the same deterministic materialization the in-process replay uses (`traces.materialize`):
rows with the same leading hash ids get the same leading tokens. Sent as token ids (vLLM, SGLang and `kvplan
serve` accept them), the server sees exactly those tokens. For a server that takes only text, each id is mapped
onto a "word token" of the given tokenizer — one whose text is a space and letters, that re-encodes to itself
alone — so the text re-tokenizes to the same length and shares the same prefixes.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.errors import UserError
from kvplan.traces import Trace
from kvplan.traces.materialize import prompt_token_ids

MIN_WORD_TOKENS = 256  # fewer usable word tokens than this and text prompts would repeat too much to be realistic


@dataclass(slots=True)
class EndpointRequest:
    row: int
    arrival_s: float
    prompt: list[int] | str
    prompt_tokens: int  # the trace's length (a text prompt's own token count may differ by a few)
    max_tokens: int
    n: int = 1
    lora: str | None = None  # the LoRA adapter the trace row names: sent as the request's model (vLLM's way)


def word_tokens(tokenizer) -> list[int]:
    """Ids whose decoded text is ' ' + letters and that encode back to exactly themselves."""
    out = []
    for token in range(len(tokenizer)):
        text = tokenizer.decode([token])
        word = len(text) > 1 and text[0] == " " and text[1:].isalpha() and text[1:].isascii()
        if word and tokenizer.encode(text, add_special_tokens=False) == [token]:
            out.append(token)
    if len(out) < MIN_WORD_TOKENS:
        raise UserError(f"--tokenizer: only {len(out)} word tokens (a space and letters, re-encoding to "
                         f"themselves); text prompts need at least {MIN_WORD_TOKENS}")
    return out


def text_writer(tokenizer, words: list[int] | None = None):
    """ids -> text of word tokens (each id mapped onto one), which re-tokenizes to as many tokens."""
    words = words if words is not None else word_tokens(tokenizer)
    return lambda ids: tokenizer.decode([words[i % len(words)] for i in ids])


def endpoint_requests(trace: Trace, *, vocab_size: int, seed: int, tokenizer=None) -> list[EndpointRequest]:
    """The trace as endpoint requests; `tokenizer` given: text prompts, else token ids below `vocab_size`."""
    words = word_tokens(tokenizer) if tokenizer is not None else None
    write = text_writer(tokenizer, words) if words is not None else None
    out = []
    for row, record in enumerate(trace.records()):
        if record.output_tokens < 1:
            raise UserError(f"--trace: {trace.reference(row)}: output_tokens {record.output_tokens}; a replay "
                             "needs >= 1")
        ids = prompt_token_ids(record, len(words) if words else vocab_size, seed)
        prompt: list[int] | str = ids if write is None else write(ids)
        out.append(EndpointRequest(row, float(record.arrival_s), prompt, int(record.prompt_tokens),
                                   int(record.output_tokens), int(record.n), record.lora))
    return out
