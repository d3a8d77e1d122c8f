"""Kernel tests run on the CPU through the Triton interpreter unless a GPU is present.

TRITON_INTERPRET must be set before any `@triton.jit` function is defined, i.e. before `kvplan.kernels`
is imported; pytest imports this conftest before the test modules, so setting it here is in time.
"""

from tests.triton_env import interpret_without_gpu

interpret_without_gpu()
