"""`kvplan bench kernels`: the paged Triton kernels against torch SDPA on a contiguous cache.

Decode: one query token per request, all requests at the same context (SDPA cannot be ragged), K/V in
randomly placed blocks. Prefill: a chunk of new tokens per request after a cached prefix, causal with the
chunk aligned to the end of the context. Both read the same K/V values as SDPA, and each grid point records
the largest difference between the two outputs, so a broken setup shows instead of a fast wrong number.

Achieved bandwidth counts the bytes the operation must move at least once: K and V of every attended
token, queries, outputs and block tables. Times are medians over repetitions measured with CUDA events,
after warmup, with L2 flushed before each repetition so that K/V really come from HBM.
"""

from __future__ import annotations

import csv
import io
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from kvplan.kernels import choose_num_splits, paged_decode_attention, paged_prefill_attention
from kvplan.bench.hbm import peak_gbps

TARGET = {"batch": 64, "context": 4096, "block_size": 16, "min_frac_peak": 0.70, "max_vs_sdpa": 1.25}
L2_FLUSH_BYTES = 256 * 2**20


@dataclass(frozen=True, slots=True)
class Grid:
    """What to measure. The default is a Llama-3-8B-like layer (32 query heads, 8 KV heads, head_dim 128)
    in float16, sized to finish in well under four minutes on one H200."""

    decode_batches: tuple[int, ...] = (1, 16, 64)
    decode_contexts: tuple[int, ...] = (1024, 4096)
    prefill_batches: tuple[int, ...] = (1, 8)
    prefill_contexts: tuple[int, ...] = (1024, 4096)
    prefill_chunk: int = 512
    block_sizes: tuple[int, ...] = (8, 16, 32, 64, 128)
    num_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    dtype: torch.dtype = torch.float16
    warmup: int = 3
    reps: int = 20


def time_ms(fn: Callable[[], object], device: torch.device, grid: Grid, flush: torch.Tensor | None) -> float:
    """Median milliseconds of `fn`: CUDA events around each call on a GPU, wall clock elsewhere."""
    for _ in range(grid.warmup):
        fn()
    if device.type != "cuda":
        times = []
        for _ in range(grid.reps):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)
    torch.cuda.synchronize(device)
    events = []
    for _ in range(grid.reps):
        if flush is not None:
            flush.zero_()  # overwrite L2 so that the timed call reads K/V from HBM
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        events.append((start, end))
    torch.cuda.synchronize(device)
    return statistics.median(s.elapsed_time(e) for s, e in events)


@dataclass(slots=True)
class Contiguous:
    """K/V of `batch` requests of `context` tokens, `[batch, num_kv_heads, context, head_dim]` for SDPA."""

    k: torch.Tensor
    v: torch.Tensor

    @classmethod
    def random(cls, grid: Grid, batch: int, context: int, device: torch.device, gen: torch.Generator):
        shape = (batch, grid.num_kv_heads, context, grid.head_dim)
        return cls(*(torch.randn(shape, generator=gen, device=device, dtype=grid.dtype) for _ in range(2)))

    def paged(self, block_size: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The same K/V in a paged cache with randomly placed blocks: (k_cache, v_cache, block_tables)."""
        batch, kv_heads, context, head_dim = self.k.shape
        per_seq = math.ceil(context / block_size)
        order = torch.randperm(batch * per_seq, generator=gen, device=self.k.device)
        caches = []
        for t in (self.k, self.v):
            padded = F.pad(t.transpose(1, 2), (0, 0, 0, 0, 0, per_seq * block_size - context))
            blocks = padded.reshape(batch * per_seq, block_size, kv_heads, head_dim)
            cache = torch.empty_like(blocks)
            cache[order] = blocks
            caches.append(cache)
        return caches[0], caches[1], order.view(batch, per_seq).to(torch.int32)


def sdpa(q: torch.Tensor, kv: Contiguous, causal: bool) -> Callable[[], torch.Tensor]:
    """SDPA on the contiguous cache, GQA handled natively when this torch build can; otherwise K/V are
    expanded to every query head once, outside the timed call."""
    mask = causal_lower_right(q.shape[2], kv.k.shape[2]) if causal else None
    try:
        F.scaled_dot_product_attention(q, kv.k, kv.v, attn_mask=mask, enable_gqa=True)
        return lambda: F.scaled_dot_product_attention(q, kv.k, kv.v, attn_mask=mask, enable_gqa=True)
    except RuntimeError:
        group = q.shape[1] // kv.k.shape[1]
        k, v = (t.repeat_interleave(group, dim=1) for t in (kv.k, kv.v))
        return lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def row(kind: str, grid: Grid, batch: int, context: int, block_size: int, kernel_ms: float, sdpa_ms: float,
        bytes_moved: float, flops: float, max_abs_diff: float, peak: float | None, **extra: object) -> dict:
    gbps = bytes_moved / kernel_ms / 1e6
    return {"kind": kind, "batch": batch, "context": context, "block_size": block_size, **extra,
            "num_heads": grid.num_heads, "num_kv_heads": grid.num_kv_heads, "head_dim": grid.head_dim,
            "dtype": str(grid.dtype).removeprefix("torch."), "kernel_ms": kernel_ms, "sdpa_ms": sdpa_ms,
            "gbps": gbps, "sdpa_gbps": bytes_moved / sdpa_ms / 1e6,
            "frac_peak": gbps / peak if peak else None, "vs_sdpa": kernel_ms / sdpa_ms,
            "tflops": flops / kernel_ms / 1e9, "max_abs_diff": max_abs_diff}


def kv_bytes(grid: Grid, tokens: int) -> int:
    return 2 * tokens * grid.num_kv_heads * grid.head_dim * grid.dtype.itemsize


def sweep_block_sizes(kind: str, grid: Grid, kv: Contiguous, launch: Callable[..., torch.Tensor],
                      expected: torch.Tensor, sdpa_ms: float, flops: float, peak: float | None,
                      flush: torch.Tensor | None, gen: torch.Generator, **extra: object) -> list[dict]:
    """Time `launch(k_cache, v_cache, block_tables)` on `kv` paged at every block size of the grid."""
    batch, _, context, _ = kv.k.shape
    rows = []
    for block_size in grid.block_sizes:
        k_cache, v_cache, tables = kv.paged(block_size, gen)

        def call(k_cache=k_cache, v_cache=v_cache, tables=tables) -> torch.Tensor:
            return launch(k_cache, v_cache, tables)

        diff = float((call().float() - expected.float()).abs().max())
        moved = kv_bytes(grid, batch * context) + 2 * expected.nbytes + tables.nbytes  # + queries and outputs
        kernel_ms = time_ms(call, kv.k.device, grid, flush)
        rows.append(row(kind, grid, batch, context, block_size, kernel_ms, sdpa_ms, moved, flops, diff, peak,
                        **extra))
        del k_cache, v_cache, tables, call
    return rows


def decode_rows(grid: Grid, batch: int, context: int, num_sms: int, peak: float | None,
                flush: torch.Tensor | None, gen: torch.Generator) -> list[dict]:
    device = gen.device
    kv = Contiguous.random(grid, batch, context, device, gen)
    q = torch.randn((batch, grid.num_heads, 1, grid.head_dim), generator=gen, device=device, dtype=grid.dtype)
    baseline = sdpa(q, kv, causal=False)
    expected = baseline()[:, :, 0]
    sdpa_ms = time_ms(baseline, device, grid, flush)
    q_paged, out = q[:, :, 0].contiguous(), torch.empty_like(expected)
    context_lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    splits = choose_num_splits(batch, grid.num_kv_heads, context, num_sms)

    def launch(k_cache: torch.Tensor, v_cache: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
        return paged_decode_attention(q_paged, k_cache, v_cache, tables, context_lens, num_splits=splits,
                                      max_context_len=context, out=out)

    flops = 4 * batch * grid.num_heads * context * grid.head_dim
    return sweep_block_sizes("decode", grid, kv, launch, expected, sdpa_ms, flops, peak, flush, gen,
                             num_splits=splits, chunk=1)


def prefill_rows(grid: Grid, batch: int, context: int, peak: float | None, flush: torch.Tensor | None,
                 gen: torch.Generator) -> list[dict]:
    device = gen.device
    chunk = min(grid.prefill_chunk, context)
    kv = Contiguous.random(grid, batch, context, device, gen)
    q = torch.randn((batch, grid.num_heads, chunk, grid.head_dim), generator=gen, device=device,
                    dtype=grid.dtype)
    baseline = sdpa(q, kv, causal=True)

    def packed(t: torch.Tensor) -> torch.Tensor:  # [batch, heads, chunk, dim] -> [batch * chunk, heads, dim]
        return t.transpose(1, 2).reshape(batch * chunk, grid.num_heads, grid.head_dim).contiguous()

    expected = packed(baseline())
    sdpa_ms = time_ms(baseline, device, grid, flush)
    q_packed, out = packed(q), torch.empty_like(expected)
    cu_seqlens = torch.arange(0, batch + 1, dtype=torch.int32, device=device) * chunk
    prefix_lens = torch.full((batch,), context - chunk, dtype=torch.int32, device=device)

    def launch(k_cache: torch.Tensor, v_cache: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
        return paged_prefill_attention(q_packed, k_cache, v_cache, tables, cu_seqlens, prefix_lens,
                                       max_query_len=chunk, out=out)

    seen = chunk * (context - chunk) + chunk * (chunk + 1) // 2  # query i sees context - chunk + i + 1 keys
    flops = 4 * batch * grid.num_heads * grid.head_dim * seen
    return sweep_block_sizes("prefill", grid, kv, launch, expected, sdpa_ms, flops, peak, flush, gen,
                             num_splits=1, chunk=chunk)


def device_info(device: torch.device) -> tuple[str, int]:
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return props.name, props.multi_processor_count
    return device.type, 1


def run(device: torch.device, grid: Grid | None = None, peak_override: float | None = None,
        seed: int = 0) -> dict:
    grid = grid or Grid()
    name, num_sms = device_info(device)
    peak = peak_gbps(name, peak_override)
    gen = torch.Generator(device=device).manual_seed(seed)
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device=device) if device.type == "cuda" else None
    rows = [r for b in grid.decode_batches for c in grid.decode_contexts
            for r in decode_rows(grid, b, c, num_sms, peak, flush, gen)]
    rows += [r for b in grid.prefill_batches for c in grid.prefill_contexts
             for r in prefill_rows(grid, b, c, peak, flush, gen)]
    return {"device": name, "num_sms": num_sms, "peak_gbps": peak,
            "peak_source": "--peak-gbps" if peak_override else ("table" if peak else "unknown device"),
            "torch": torch.__version__, "rows": rows, "target": check_target(rows)}


def check_target(rows: list[dict]) -> dict:
    """The issue's goal: decode at batch 64, context 4096, block 16 reaches 70% of peak HBM bandwidth and
    stays within 1.25x of SDPA on a contiguous cache."""
    keys = ("batch", "context", "block_size")
    point = next((r for r in rows if r["kind"] == "decode" and all(r[k] == TARGET[k] for k in keys)), None)
    if point is None:
        return {**TARGET, "measured": False}
    frac_ok = point["frac_peak"] is not None and point["frac_peak"] >= TARGET["min_frac_peak"]
    return {**TARGET, "measured": True, "frac_peak": point["frac_peak"], "vs_sdpa": point["vs_sdpa"],
            "frac_peak_ok": frac_ok, "vs_sdpa_ok": point["vs_sdpa"] <= TARGET["max_vs_sdpa"]}


def to_csv(result: dict) -> str:
    buffer = io.StringIO()
    fields = ["device", *result["rows"][0]] if result["rows"] else ["device"]
    writer = csv.DictWriter(buffer, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for r in result["rows"]:
        writer.writerow({"device": result["device"], **r})
    return buffer.getvalue()
