"""Attention backends: `torch` (reference, any device) and `triton` (paged kernels)."""

from __future__ import annotations

from engine.backends.torch_backend import TorchAttentionBackend

BACKENDS = ("torch", "triton")


def make_backend(name: str):
    if name == "torch":
        return TorchAttentionBackend()
    if name == "triton":
        from engine.backends.triton_backend import TritonAttentionBackend

        return TritonAttentionBackend()
    raise ValueError(f"attention_backend: unknown backend {name!r}; allowed: {', '.join(BACKENDS)}")
