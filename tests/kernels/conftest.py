"""Kernel tests run on the CPU through the Triton interpreter unless a GPU is present.

TRITON_INTERPRET must be set before any `@triton.jit` function is defined, i.e. before the `kernels`
package is imported; pytest imports this conftest before the test modules, so setting it here is in time.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
