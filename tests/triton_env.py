"""Without a GPU, Triton kernels run in the interpreter. TRITON_INTERPRET must be set before any @triton.jit function
is defined, i.e. before `kvplan.kernels` is imported: tests/engine/conftest.py and tests/kernels/conftest.py call this
before their modules are collected, tests/conftest.py before any other test marked `engine` runs."""

from __future__ import annotations

import os


def interpret_without_gpu() -> None:
    import torch  # the engine's tests need it anyway; the core's, the simulator's and the traces' never import it

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
