"""StreamingLLM's shifted positions on a cache of keys rotated at their original positions.

In `shifted` mode a query sees its retained keys at their positions *within the cache* (sinks first, then the
window), never a position beyond the cache size. RoPE makes a score depend only on the position difference, so
there is no need to re-rotate the cache: for a query at original position q that has a gap behind it
(q >= S + W, S sinks and a window of W tokens)::

    cache index:   sinks 0 .. S-1 | window S .. S+W-1 (the query is the last, S+W-1)
    window key p:  (S+W-1) - (S + p - (q-W+1)) = q - p          - the original difference: as stored
    sink key p:    (S+W-1) - p  =  (q - p) - delta,  delta = q - (S+W-1)

Only the sinks' scores change. A key is stored as R(p) k and the query arrives as R(q) x, so scoring the sinks
with the query rotated back by delta, R(-delta) R(q) x . R(p) k, depends on (q - delta) - p: the distance in the
cache. Before the gap opens (q < S + W) every token is retained at its own index: delta = 0.

This holds for rotations that are a pure function of position (`default`, `linear`, `llama3`, `yarn` RoPE);
types that rescale with the sequence length (`dynamic`, `longrope`) are refused, as are models without RoPE.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvplan.errors import UserError

POSITION_MODES = ("original", "shifted")
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


@dataclass(slots=True)
class Rope:
    inv_freq: torch.Tensor  # [rotary_dim / 2] float32, as the model's rotary embedding holds it

    def rotate(self, x: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """x [..., n, head_dim] rotated by offsets [n] positions (HF's rotate-half layout; a partial rotary
        embedding turns only the first rotary_dim dimensions)."""
        angles = offsets.to(torch.float32)[:, None] * self.inv_freq.to(x.device)[None, :]
        angles = torch.cat((angles, angles), -1)
        cos, sin = angles.cos(), angles.sin()
        dim = cos.shape[-1]
        turned, rest = x[..., :dim].float(), x[..., dim:]
        half = dim // 2
        rotated = turned * cos + torch.cat((-turned[..., half:], turned[..., :half]), -1) * sin
        return torch.cat((rotated.to(x.dtype), rest), -1)

    @staticmethod
    def sink_offsets(query_positions: torch.Tensor, sink_tokens: int, window_tokens: int) -> torch.Tensor:
        """delta per query: how much closer than stored its sink keys are in the cache's own positions."""
        return (query_positions - (sink_tokens + window_tokens - 1)).clamp(min=0)


def rope_for_positions(model: torch.nn.Module, mode: str, window_tokens: int,
                       attention_backend: str | None) -> Rope | None:
    """None for `original` positions (retained tokens keep theirs); for `shifted`, the model's rotation - on a
    sink+window cache, with the torch or cpu attention backend (the Triton kernels know no per-query rotation)."""
    if mode not in POSITION_MODES:
        raise UserError(f"position_mode: unknown {mode!r}; allowed: {', '.join(POSITION_MODES)}")
    if mode == "original":
        return None
    if not window_tokens:
        raise UserError("position_mode 'shifted' assigns positions within a sink+window cache: it needs "
                         "window_tokens > 0")
    if attention_backend not in (None, "torch", "cpu"):
        raise UserError(f"position_mode 'shifted' runs on the torch and cpu attention backends, not "
                         f"{attention_backend!r}")
    return find_rope(model, type(model).__name__)


def find_rope(model: torch.nn.Module, architecture: str) -> Rope:
    """The model's rotary embedding, or ValueError when shifted positions cannot be expressed on it."""
    for module in model.modules():
        inv_freq = getattr(module, "inv_freq", None)
        if isinstance(inv_freq, torch.Tensor):
            rope_type = getattr(module, "rope_type", "default")
            if rope_type not in STATIC_ROPE_TYPES:
                raise UserError(f"position_mode 'shifted': {architecture} uses {rope_type!r} RoPE, which rescales "
                                 f"with the sequence length; allowed: {', '.join(STATIC_ROPE_TYPES)} RoPE")
            return Rope(inv_freq.detach().float().cpu())
    raise UserError(f"position_mode 'shifted' re-positions RoPE keys, and {architecture} has no rotary embedding "
                     "(absolute positions are baked into its cached keys); allowed: a RoPE model, or 'original'")
