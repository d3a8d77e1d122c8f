"""Attention backends behind one interface (`store_kv`, `attend`):

* `torch` - the reference on any device: gathers each sequence's blocks, then matmuls / SDPA;
* `cpu` - the torch backend with decode attention by a fused C++ kernel reading the blocks in place (the default
  on CPU when the kernel builds here, else `torch`);
* `triton` - the paged kernels of `kernels/`: the default on CUDA, and on CPU only under TRITON_INTERPRET=1, for
  tests.
"""

from __future__ import annotations

import logging
import os

import torch

from kvplan.engine.backends.torch_backend import TorchAttentionBackend
from kvplan.errors import UserError

BACKENDS = ("torch", "cpu", "triton")
log = logging.getLogger(__name__)


def default_backend(device: torch.device) -> str:
    if device.type == "cuda":
        return "triton"
    from kvplan.engine.backends.cpu_backend import cpu_kernel_error

    error = cpu_kernel_error()
    if error is None:
        return "cpu"
    log.warning("fused CPU decode kernel unavailable (%s): using the torch attention backend", error)
    return "torch"


def make_backend(name: str, device: torch.device):
    if name == "torch":
        return TorchAttentionBackend()
    if name == "cpu":
        if device.type != "cpu":
            raise UserError(f"attention_backend 'cpu' runs on the CPU only, not on {device}")
        from kvplan.engine.backends.cpu_backend import CpuAttentionBackend

        return CpuAttentionBackend()
    if name == "triton":
        if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise UserError("attention_backend 'triton' needs a CUDA device; on CPU it runs only under "
                             "TRITON_INTERPRET=1 (set before start-up), as the tests do")
        from kvplan.engine.backends.triton_backend import TritonAttentionBackend

        return TritonAttentionBackend()
    raise UserError(f"attention_backend: unknown backend {name!r}; allowed: {', '.join(BACKENDS)}")
