"""CPU backend: the torch backend's prefill and KV stores, with decode attention done by a fused C++ kernel
(`cpu_decode.cpp`) that reads each sequence's blocks in place instead of gathering them.

On CPU the torch backend's decode is bound by copying every sequence's K/V through its block table (and by
matmuls that score each query head against every KV head); the fused kernel reads the cache once per step.
The extension is compiled by the install step (`python -m kvplan.engine.backends.kernel_build`), or on first use, with
torch's C++ extension loader (g++ and ninja) into the torch extensions cache, for this machine's CPU (see
`engine.backends.kernel_build`: visible, bounded, never stuck on a stale lock); `cpu_kernel_error()` says why it
cannot be built, if it cannot.
"""

from __future__ import annotations

import functools
import hashlib
import platform
import sys
from pathlib import Path

import torch

from kvplan.engine.backends.torch_backend import TorchAttentionBackend
from kvplan.engine.forward_context import AttentionMetadata, LayerKV
from kvplan.shipped import shipped_dir

SOURCE = shipped_dir("engine/csrc") / "cpu_decode.cpp"  # the repository's engine/csrc/, installed as data


def _build_tag() -> str:
    """The build targets this CPU (-march=native) and this environment's torch headers: a cached build must not
    be loaded on another CPU, and two virtual environments must not keep rebuilding over each other."""
    try:
        flags = next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")),
                     "")
    except OSError:
        flags = ""
    key = f"{platform.machine()} {flags} {Path(torch.__file__).parent} {torch.__version__}"
    return hashlib.blake2b(key.encode(), digest_size=6).hexdigest()


def _load(name: str):
    from torch.utils.cpp_extension import load

    return load(name=name, sources=[str(SOURCE)], extra_cflags=["-O3", "-march=native", "-fopenmp"],
                extra_ldflags=["-fopenmp"], verbose=False)


@functools.cache
def cpu_kernel():
    """The compiled extension module (built once per machine and source version). A first build runs in a
    child with a message and a time bound, and a lock left by a killed build is cleared (kernel_build)."""
    from kvplan.caches import torch_extensions_dir
    from kvplan.engine.backends.kernel_build import (
        build_directory,
        build_in_child,
        build_lock,
        build_timeout_s,
        is_built,
        load_built,
    )

    torch_extensions_dir()  # an unwritable extensions cache: a private one, with a line (kvplan.caches)
    name, what = f"kvplan_cpu_decode_{_build_tag()}", "the CPU decode kernel"
    folder, timeout = build_directory(name), build_timeout_s()
    with build_lock(folder, timeout) as fd:
        if not is_built(name, (SOURCE,)):
            build_in_child(name, __name__, folder, fd, timeout, what)
        return load_built(folder, name, lambda: _load(name),
                          lambda: build_in_child(name, __name__, folder, fd, timeout, what))


@functools.cache
def cpu_kernel_error() -> str | None:
    """None when the fused kernel builds and loads here, else the reason."""
    try:
        cpu_kernel()
    except Exception as exc:  # compiler, ninja or loader missing: the caller falls back to the torch backend
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"
    return None


def paged_decode(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                 block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float, sink_tokens: int = 0,
                 window_tokens: int = 0) -> torch.Tensor:
    """Decode attention: query [B, H, D] (any float dtype) over the paged caches -> [B, H, D] float32."""
    return cpu_kernel().paged_decode(query.float().contiguous(), key_cache, value_cache,
                                     block_tables.to(torch.int32).contiguous(),
                                     context_lens.to(torch.int32).contiguous(), scale, sink_tokens, window_tokens)


class CpuAttentionBackend(TorchAttentionBackend):
    name = "cpu"

    def __init__(self) -> None:
        super().__init__()
        error = cpu_kernel_error()
        if error is not None:
            raise RuntimeError(f"attention_backend 'cpu': the fused decode kernel cannot be built here ({error}); "
                               "use attention_backend='torch'")

    def _decode(self, query: torch.Tensor, layer: LayerKV, meta: AttentionMetadata, scale: float,
                out: torch.Tensor) -> None:
        if layer.key_scale is not None:  # the fused kernel reads 16/32-bit caches: quantized ones are gathered
            super()._decode(query, layer, meta, scale, out)  # and dequantized by the torch path
            return
        out.copy_(paged_decode(query, layer.key, layer.value, meta.decode_block_tables, meta.decode_context_lens,
                               scale, meta.sink_tokens, meta.window_tokens))


if __name__ == "__main__" and sys.argv[1:] == ["--build-only"]:  # the child kernel_build.build_in_child starts
    _load(f"kvplan_cpu_decode_{_build_tag()}")
