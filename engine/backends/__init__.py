"""Attention backends behind one interface (`store_kv`, `attend`): `torch` (reference, any device) and `triton`
(the paged kernels of `kernels/`; the default on CUDA, and on CPU only under TRITON_INTERPRET=1, for tests)."""

from __future__ import annotations

import os

import torch

from engine.backends.torch_backend import TorchAttentionBackend

BACKENDS = ("torch", "triton")


def make_backend(name: str, device: torch.device):
    if name == "torch":
        return TorchAttentionBackend()
    if name == "triton":
        if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError("attention_backend 'triton' needs a CUDA device; on CPU it runs only under "
                             "TRITON_INTERPRET=1 (set before start-up), as the tests do")
        from engine.backends.triton_backend import TritonAttentionBackend

        return TritonAttentionBackend()
    raise ValueError(f"attention_backend: unknown backend {name!r}; allowed: {', '.join(BACKENDS)}")
