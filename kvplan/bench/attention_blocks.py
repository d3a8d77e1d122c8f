"""The engine's own paged attention kernels on this CPU, timed against the KV block size and the context: the
measurement behind the block-size shape of `sim.gpu.attention` (scripts/attention_block_size.py runs it).

Decode: the fused CPU kernel (`engine/csrc/cpu_decode.cpp`, what `attention_backend="cpu"` runs) over a cache of
randomly placed blocks, `batch` requests at the same context, one query token each. Every context is a multiple of
the largest block size, so no block is partly filled and the blocks read are exactly context / block_size per
request. Prefill: the torch backend's SDPA call on one chunk of new tokens after no prefix (causal), the shape
the engine's CPU prefill runs.

Timing: the minimum over `reps` calls, the block sizes of one context visited in turn in every round, so that a
slow 10 s window of a shared machine (times drift ~1.8x) hits every block size alike; the minimum is the least
disturbed call. Contents are seeded (`torch.Generator`).

`fit_decode` reads the rows as t = t0 + a × tokens + c × blocks + d × requests (least squares, each row weighted
by 1 / t so that every row counts by its relative error): `a` is the cost of one token's K/V, `c` of one block
(the table lookup, the address, the start of a new run of memory), `d` of one request (its query, softmax and
output). `c / a` and `d / a` are the overheads in tokens, the shape of the block-size effect that
`sim.gpu.attention` carries to GPUs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclass(frozen=True, slots=True)
class Shape:
    """A Llama-3-8B-like attention layer by default (32 query heads, 8 KV heads, head_dim 128), bf16 cache."""

    num_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    dtype: str = "bfloat16"  # a torch dtype's name: torch is imported only to measure (fit_decode needs none)


def _best(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def decode_case(shape: Shape, block_size: int, batch: int, context: int, gen):
    """(call, expected): one decode call over a paged cache of randomly placed blocks, and its result computed by
    plain attention on the same K/V (a broken layout shows instead of a fast wrong number). `gen`: a seeded
    torch.Generator."""
    import torch

    from kvplan.engine.backends.cpu_backend import paged_decode

    per_seq = -(-context // block_size)
    blocks = batch * per_seq
    dims = (blocks, block_size, shape.num_kv_heads, shape.head_dim)
    dtype = getattr(torch, shape.dtype)
    k = torch.randn(dims, generator=gen).to(dtype)
    v = torch.randn(dims, generator=gen).to(dtype)
    tables = torch.randperm(blocks, generator=gen).to(torch.int32).view(batch, per_seq)
    lens = torch.full((batch,), context, dtype=torch.int32)
    q = torch.randn((batch, shape.num_heads, shape.head_dim), generator=gen)
    scale = shape.head_dim ** -0.5

    def call():
        return paged_decode(q, k, v, tables, lens, scale)

    group = shape.num_heads // shape.num_kv_heads
    keys = k[tables.long()].reshape(batch, -1, shape.num_kv_heads, shape.head_dim)[:, :context].float()
    values = v[tables.long()].reshape(batch, -1, shape.num_kv_heads, shape.head_dim)[:, :context].float()
    keys, values = (x.repeat_interleave(group, dim=2).transpose(1, 2) for x in (keys, values))  # [B, H, T, D]
    probs = torch.softmax(torch.einsum("bhd,bhtd->bht", q, keys) * scale, dim=-1)
    return call, torch.einsum("bht,bhtd->bhd", probs, values)


def measure_decode(block_sizes: Sequence[int] = BLOCK_SIZES, contexts: Sequence[int] = (512, 2048),
                   batches: Sequence[int] = (1, 4), reps: int = 15, shape: Shape | None = None,
                   seed: int = 0) -> list[dict]:
    """One row per (batch, context, block size): the fastest of `reps` calls, in seconds, and the largest
    difference from plain attention. Contexts must be multiples of every block size (whole blocks only)."""
    import torch

    shape = shape or Shape()
    bad = [c for c in contexts if any(c % b for b in block_sizes)]
    if bad:
        raise ValueError(f"contexts {bad} are not multiples of every block size {tuple(block_sizes)}")
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for batch in batches:
        for context in contexts:
            cases = {b: decode_case(shape, b, batch, context, gen) for b in block_sizes}
            diffs = {b: float((call() - expected).abs().max()) for b, (call, expected) in cases.items()}
            best = {b: float("inf") for b in block_sizes}
            for _ in range(reps):  # every block size once per round: drift hits all of them alike
                for b, (call, _expected) in cases.items():
                    best[b] = min(best[b], _best(call))
            rows += [{"kind": "decode", "batch": batch, "context": context, "block_size": b,
                      "blocks": batch * context // b, "tokens": batch * context, "seconds": best[b],
                      "max_abs_diff": diffs[b]} for b in block_sizes]
    return rows


def measure_prefill(chunks: Sequence[int] = (32, 64, 128, 256, 512, 1024), reps: int = 7,
                    shape: Shape | None = None, seed: int = 0) -> list[dict]:
    """One row per chunk length: the torch backend's causal SDPA over a chunk with no cached prefix (the call the
    engine's CPU prefill makes), fastest of `reps`, with its query-key pairs (chunk × (chunk + 1) / 2)."""
    import torch

    from kvplan.engine.backends.torch_backend import _sdpa

    shape = shape or Shape()
    dtype = getattr(torch, shape.dtype)
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for chunk in chunks:
        q = torch.randn((1, shape.num_heads, chunk, shape.head_dim), generator=gen).to(dtype)
        k, v = (torch.randn((1, shape.num_kv_heads, chunk, shape.head_dim), generator=gen).to(dtype)
                for _ in range(2))

        def call(q=q, k=k, v=v):
            return _sdpa(q, k, v, None, True, shape.head_dim ** -0.5)

        call()
        seconds = min(_best(call) for _ in range(reps))
        rows.append({"kind": "prefill", "chunk": chunk, "pairs": chunk * (chunk + 1) // 2, "seconds": seconds})
    return rows


@dataclass(frozen=True, slots=True)
class DecodeFit:
    """t = t0 + per_token × tokens + per_block × blocks + per_request × requests (seconds)."""

    t0: float
    per_token: float
    per_block: float
    per_request: float
    median_abs_err: float  # of the fit over its own rows, relative

    @property
    def block_tokens(self) -> float:
        """A block's overhead in tokens' worth of K/V."""
        return self.per_block / self.per_token

    @property
    def request_tokens(self) -> float:
        return self.per_request / self.per_token


def fit_decode(rows: Sequence[dict]) -> DecodeFit:
    """Least squares on relative residuals over the decode rows (`measure_decode`)."""
    decode = [r for r in rows if r["kind"] == "decode"]
    t = np.array([r["seconds"] for r in decode])
    x = np.array([[1.0, r["tokens"], r["blocks"], r["batch"]] for r in decode])
    coef, *_ = np.linalg.lstsq(x / t[:, None], np.ones_like(t), rcond=None)
    err = float(np.median(np.abs(x @ coef / t - 1.0)))
    return DecodeFit(*(float(c) for c in coef), median_abs_err=err)


def run(contexts: Sequence[int] = (512, 2048), batches: Sequence[int] = (1, 4), reps: int = 15,
        threads: int = 1, seed: int = 0) -> dict:
    """The decode sweep over BLOCK_SIZES, the prefill sweep, and the decode fit, on `threads` CPU threads (one by
    default: a shared machine's other sessions then disturb one core, not the kernel's thread pool)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        decode = measure_decode(BLOCK_SIZES, contexts, batches, reps, seed=seed)
        prefill = measure_prefill(reps=max(3, reps // 2), seed=seed)
    finally:
        torch.set_num_threads(before)
    fit = fit_decode(decode)
    return {"threads": threads, "reps": reps, "torch": torch.__version__, "rows": decode + prefill,
            "fit": {"t0": fit.t0, "per_token": fit.per_token, "per_block": fit.per_block,
                    "per_request": fit.per_request, "block_tokens": fit.block_tokens,
                    "request_tokens": fit.request_tokens, "median_abs_err": fit.median_abs_err}}
