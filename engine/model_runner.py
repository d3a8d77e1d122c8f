"""Turns a scheduler step into one forward pass of the HF model over the paged cache.

Packing: the new tokens of all prefill/chunk/recompute requests first, then one token per decoding request, in a
single [1, tokens] batch with explicit positions. The model computes logits only for the rows that sample.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.core.outputs import ScheduledRequest, SchedulerOutput
from engine.forward_context import AttentionMetadata, ForwardContext, forward_context
from engine.kv_cache import PagedKVCache


@dataclass(slots=True)
class PreparedStep:
    input_ids: torch.Tensor  # [1, tokens]
    positions: torch.Tensor  # [1, tokens]
    metadata: AttentionMetadata
    sample_rows: torch.Tensor  # packed row of each sampling request's last token
    sampled_items: list[ScheduledRequest]  # in the order of `sample_rows`


class ModelRunner:
    def __init__(self, model: torch.nn.Module, kv_cache: PagedKVCache, backend, device: torch.device) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.backend = backend
        self.device = device
        self.block_size = kv_cache.layout.block_size

    def apply_memory_ops(self, step: SchedulerOutput) -> None:
        """In the order the core prescribes: swap-out, copy-on-write, swap-in."""
        self.kv_cache.swap_out(step.swap_out)
        self.kv_cache.copy_blocks(step.copies)
        self.kv_cache.swap_in(step.swap_in)

    def prepare(self, step: SchedulerOutput) -> PreparedStep:
        bs = self.block_size
        prefills = [item for item in step.scheduled if not item.is_decode]
        decodes = [item for item in step.scheduled if item.is_decode]
        ids: list[int] = []
        positions: list[int] = []
        slots: list[torch.Tensor] = []
        starts, lens, key_positions, key_slots, sample_rows, sampled = [], [], [], [], [], []
        for item in prefills:
            start, n = item.start_pos, item.num_new_tokens
            kpos = torch.arange(start + n)
            blocks = torch.tensor(item.block_ids, dtype=torch.long)[kpos // bs]
            visible = blocks >= 0  # sink+window holes are not attended to
            kpos, kslots = kpos[visible], (blocks * bs + kpos % bs)[visible]
            starts.append(len(ids))
            lens.append(n)
            key_positions.append(kpos.to(self.device))
            key_slots.append(kslots.to(self.device))
            slots.append(kslots[-n:])
            ids.extend(item.request.token_ids[start:start + n])
            positions.extend(range(start, start + n))
            if item.samples:
                sample_rows.append(len(ids) - 1)
                sampled.append(item)
        num_prefill_tokens = len(ids)
        tables = mask = None
        if decodes:
            tables, mask, decode_slots = self._decode_tables(decodes)
            slots.append(decode_slots)
            for item in decodes:
                ids.append(item.request.token_ids[item.start_pos])
                positions.append(item.start_pos)
                sample_rows.append(len(ids) - 1)
                sampled.append(item)
        metadata = AttentionMetadata(torch.cat(slots).to(self.device), starts, lens, key_positions, key_slots,
                                     num_prefill_tokens, tables, mask)
        device = self.device
        return PreparedStep(torch.tensor([ids], device=device), torch.tensor([positions], device=device), metadata,
                            torch.tensor(sample_rows, dtype=torch.long, device=device), sampled)

    def _decode_tables(self, decodes: list[ScheduledRequest]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        bs = self.block_size
        width = max(len(item.block_ids) for item in decodes)
        tables = torch.full((len(decodes), width), -1, dtype=torch.long)
        for row, item in enumerate(decodes):
            tables[row, :len(item.block_ids)] = torch.tensor(item.block_ids, dtype=torch.long)
        context = torch.tensor([item.start_pos + 1 for item in decodes])
        key_index = torch.arange(width * bs)
        mask = (key_index.unsqueeze(0) < context.unsqueeze(1)) & (tables.repeat_interleave(bs, dim=1) >= 0)
        last = context - 1
        slots = tables.gather(1, (last // bs).unsqueeze(1)).squeeze(1) * bs + last % bs
        return tables.clamp(min=0).to(self.device), mask.to(self.device), slots

    @torch.inference_mode()
    def forward(self, prepared: PreparedStep) -> torch.Tensor:
        """Logits [sampling requests, vocab] (float32)."""
        context = ForwardContext(prepared.metadata, self.kv_cache.layers, self.backend)
        keep = prepared.sample_rows if len(prepared.sample_rows) else torch.tensor([0], device=self.device)
        with forward_context(context):
            output = self.model(input_ids=prepared.input_ids, position_ids=prepared.positions, use_cache=False,
                                logits_to_keep=keep)
        logits = output.logits[0].float()
        return logits if len(prepared.sample_rows) else logits[:0]
