"""Speculative decoding's configuration (vLLM's `--speculative-config`), parsed in this one place.

The setting is a JSON object in vLLM's spelling: `{"method": "ngram", "num_speculative_tokens": 4,
"prompt_lookup_max": 4, "prompt_lookup_min": 1}` (prompt lookup over the request's own tokens) or `{"method":
"draft_model", "model": "<dir>", "num_speculative_tokens": 3}` (a small model proposing autoregressively).
What the scheduler takes from it, as vLLM 0.34's speculator configs derive it (`v1/worker/gpu/spec_decode/
ngram/config.py`, `standalone_ar/config.py`):

* `num_speculative_tokens` k: drafts proposed per request and step;
* `num_lookahead_tokens`: KV slots reserved past the scheduled tokens (a draft model writes the KV of its own
  proposals there: k; ngram computes nothing: 0);
* `draft_slots`: extra input rows a scheduled request takes from the step's token budget (the draft model keeps
  one unsliced token: 1; ngram: 0).

ngram's lookup bounds default as vLLM's: neither given, 5 and 5; one given, the other takes its value.

Two keys are the simulator's only (the live engine measures acceptance, it never reads them): `acceptance`, the
probabilities of accepting 0..k drafts in a step (k + 1 numbers summing to 1), and `acceptance_rate`, a per-draft
acceptance probability in (0, 1].
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Final

from kvplan.errors import ConfigError, short_repr

METHODS: Final = ("ngram", "draft_model")
KEYS: Final = ("method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min", "model",
               "acceptance", "acceptance_rate")
MAX_SPECULATIVE_TOKENS: Final = 64  # vLLM's kernels take a few to tens of drafts; more is a typo
NGRAM_DEFAULT_LOOKUP: Final = 5  # vLLM's default of both bounds when neither is given


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    """One parsed `speculative_config` (see the module). Invariant: 1 <= num_speculative_tokens <=
    MAX_SPECULATIVE_TOKENS; ngram has 1 <= prompt_lookup_min <= prompt_lookup_max; draft_model has a model;
    `acceptance`, when given, has k + 1 probabilities summing to 1."""

    method: str
    num_speculative_tokens: int
    prompt_lookup_max: int = 0
    prompt_lookup_min: int = 0
    model: str | None = None
    acceptance: tuple[float, ...] | None = None  # simulator-only
    acceptance_rate: float | None = None  # simulator-only

    @property
    def num_lookahead_tokens(self) -> int:
        """KV slots reserved past a step's scheduled tokens (vLLM's `num_lookahead_tokens`)."""
        return self.num_speculative_tokens if self.method == "draft_model" else 0

    @property
    def draft_slots(self) -> int:
        """Extra budget rows per scheduled request (vLLM's `max_num_new_slots_for_drafting`)."""
        return 1 if self.method == "draft_model" else 0


def _int(data: dict, key: str, minimum: int, default: int | None) -> int | str:
    """The integer under `key` (or `default` when absent), or what is wrong with it."""
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= MAX_SPECULATIVE_TOKENS:
        return (f"key {key!r} must be an integer >= {minimum} and <= {MAX_SPECULATIVE_TOKENS}, got "
                f"{short_repr(value)}")
    return value


def _acceptance(data: dict, k: int) -> tuple[float, ...] | str | None:
    value = data.get("acceptance")
    if value is None:
        return None
    if (not isinstance(value, list) or len(value) != k + 1
            or not all(isinstance(p, int | float) and not isinstance(p, bool) and math.isfinite(p) and 0 <= p <= 1
                       for p in value)
            or abs(sum(value, 0.0) - 1.0) > 1e-6):  # (a float sum: a compiled core checks the type)
        return (f"key 'acceptance' must be a list of {k + 1} probabilities (of accepting 0..{k} drafts in a step) "
                f"summing to 1, got {short_repr(value)}")
    return tuple(float(p) for p in value)


def speculative_problem(text: object) -> tuple[SpeculativeConfig | None, str | None]:
    """(the parsed config, None) or (None, what is wrong with `text`)."""
    if not isinstance(text, str):
        return None, f"must be a JSON object as a string, got {short_repr(text)}"
    try:
        data = json.loads(text)
    except ValueError as exc:
        return None, f"not valid JSON ({exc}); allowed: a JSON object such as '{{\"method\": \"ngram\", " \
                     "\"num_speculative_tokens\": 4}'"
    if not isinstance(data, dict):
        return None, f"must be a JSON object, got {short_repr(data)}"
    unknown = sorted(set(data) - set(KEYS))
    if unknown:
        return None, f"unknown key {unknown[0]!r}; allowed: {', '.join(KEYS)}"
    method = data.get("method")
    if method not in METHODS:
        return None, f"unknown method {short_repr(method)}; allowed: {', '.join(METHODS)}"
    k = _int(data, "num_speculative_tokens", 1, None)
    if isinstance(k, str):
        return None, k
    lookup_max, lookup_min, model = 0, 0, data.get("model")
    if method == "ngram":
        bounds = {key: data.get(key) for key in ("prompt_lookup_max", "prompt_lookup_min")}
        if bounds["prompt_lookup_max"] is None and bounds["prompt_lookup_min"] is None:
            bounds = dict.fromkeys(bounds, NGRAM_DEFAULT_LOOKUP)
        elif bounds["prompt_lookup_max"] is None:  # one given: the other takes its value (vLLM)
            bounds["prompt_lookup_max"] = bounds["prompt_lookup_min"]
        elif bounds["prompt_lookup_min"] is None:
            bounds["prompt_lookup_min"] = bounds["prompt_lookup_max"]
        high = _int(bounds, "prompt_lookup_max", 1, None)
        low = _int(bounds, "prompt_lookup_min", 1, None)
        if isinstance(high, str):
            return None, high
        if isinstance(low, str):
            return None, low
        if low > high:
            return None, (f"key 'prompt_lookup_min' ({low}) exceeds 'prompt_lookup_max' ({high}); allowed: "
                          "prompt_lookup_min <= prompt_lookup_max")
        lookup_max, lookup_min = high, low
        if model is not None:
            return None, "key 'model' is for method 'draft_model'; allowed for 'ngram': no model"
    elif not isinstance(model, str) or not model:
        return None, f"method 'draft_model' needs key 'model' (a model name or directory), got {short_repr(model)}"
    acceptance = _acceptance(data, k)
    if isinstance(acceptance, str):
        return None, acceptance
    rate = data.get("acceptance_rate")
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 < rate <= 1):
        return None, f"key 'acceptance_rate' must be a number > 0 and <= 1, got {short_repr(rate)}"
    return SpeculativeConfig(method, k, lookup_max, lookup_min, model if method == "draft_model" else None,
                             acceptance, None if rate is None else float(rate)), None


def parse_speculative_config(text: str | None, path: str) -> SpeculativeConfig | None:
    """The config `text` describes (None: speculative decoding off); bad input raises one line after `path`."""
    if text is None:
        return None
    config, problem = speculative_problem(text)
    if problem is not None:
        raise ConfigError(f"{path}: {problem}")
    return config
