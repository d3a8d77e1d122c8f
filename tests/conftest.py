"""Test-wide setup. TRITON_INTERPRET must be set before any @triton.jit function is defined, so it goes first."""

import os

try:  # without a GPU, Triton kernels run in the interpreter
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
except ImportError:
    os.environ.setdefault("TRITON_INTERPRET", "1")
