"""Prompt-lookup (n-gram) drafts, as vLLM 0.34's n-gram speculator proposes them (v1/worker/gpu/spec_decode/ngram).

For n from `prompt_lookup_max` down to `prompt_lookup_min`, the sequence's last n tokens are looked for earlier in
the sequence (prompt and output): the longest n that matches wins, at its rightmost match, and the drafts are the
tokens that followed it. vLLM always proposes k drafts: the slots with no token to copy (the match is too close
to the end, or nothing matched) hold the last token, verified like any other draft.
"""

from __future__ import annotations

from collections.abc import Sequence


def propose_ngram(tokens: Sequence[int], k: int, lookup_min: int, lookup_max: int) -> list[int]:
    """k drafts for the sequence `tokens` (see the module)."""
    length = len(tokens)
    last = tokens[-1]
    for n in range(min(lookup_max, length - 1), lookup_min - 1, -1):
        suffix = list(tokens[length - n:])
        for pos in range(length - n - 1, -1, -1):  # rightmost first; a match must end before the suffix
            if list(tokens[pos:pos + n]) == suffix:
                follow = list(tokens[pos + n:pos + n + k])
                return follow + [last] * (k - len(follow))
    return [last] * k
