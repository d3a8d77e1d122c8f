"""Triton kernels for paged KV and their torch reference implementations.

The functional API the engine calls; each wrapper validates its arguments (`kernels.checks`) and launches
one kernel. On a machine without CUDA the kernels run only under TRITON_INTERPRET=1, which must be set before
this package is imported (Triton reads it when the kernels are defined).
"""

import torch

from kvplan.caches import prepare_triton

if torch.cuda.is_available():  # Triton compiles into its cache on first launch: make sure it can (kvplan.caches)
    prepare_triton()

from kvplan.kernels.copy_blocks import copy_blocks
from kvplan.kernels.decode_attention import choose_num_splits, paged_decode_attention
from kvplan.kernels.prefill_attention import paged_prefill_attention
from kvplan.kernels.quant import QMAX, make_scales
from kvplan.kernels.store_kv import store_kv

__all__ = [
    "QMAX",
    "choose_num_splits",
    "copy_blocks",
    "make_scales",
    "paged_decode_attention",
    "paged_prefill_attention",
    "store_kv",
]
