"""Sizing the KV cache on a GPU the way vLLM does: run the largest step once, read the allocator's peak, and give
what remains of `gpu_memory_utilization` x total memory to KV blocks."""

from __future__ import annotations

import torch

from kvplan.engine.core import make_request
from kvplan.engine.core.outputs import ScheduledRequest, SchedulerOutput
from kvplan.engine.kv_cache import KVLayout, PagedKVCache
from kvplan.engine.model_runner import ModelRunner


def dummy_prefill_step(num_tokens: int, block_size: int) -> SchedulerOutput:
    """One request prefilling `num_tokens` tokens into blocks 0, 1, ... - the largest step the scheduler can emit."""
    blocks = -(-num_tokens // block_size)
    request = make_request("memory-profile", prompt_token_ids=[0] * num_tokens, max_tokens=1)
    item = ScheduledRequest(request, num_tokens, 0, 0, list(range(blocks)), samples=True, is_decode=False)
    return SchedulerOutput(0, [item], num_tokens)


def gpu_kv_blocks(model: torch.nn.Module, layout: KVLayout, backend, device: torch.device, utilization: float,
                  max_batched_tokens: int) -> int:
    step = dummy_prefill_step(max_batched_tokens, layout.block_size)
    scratch = PagedKVCache(layout, len(step.scheduled[0].block_ids), 0, device)
    runner = ModelRunner(model, scratch, backend, device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    runner.forward(runner.prepare(step))
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - scratch.num_blocks * layout.bytes_per_block
    del runner, scratch
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(device).total_memory
    return layout.blocks_in(max(int(total * utilization) - peak, 0))
