"""Turns a scheduler step into one forward pass of the HF model over the paged cache.

Packing: the new tokens of all prefill/chunk/recompute requests first, then one token per decoding request, in a
single [1, tokens] batch with explicit positions. The model computes logits only for the rows that sample: a
request's last token, and with speculative decoding its last verified token and every draft after it (the drafts
are the inputs of the step's last positions; their KV is written like any token's, and overwritten next step
where they were rejected).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kvplan.engine.core.outputs import ScheduledRequest, SchedulerOutput
from kvplan.engine.forward_context import AttentionMetadata, ForwardContext, forward_context
from kvplan.engine.kv_cache import PagedKVCache


@dataclass(slots=True)
class PreparedStep:
    input_ids: torch.Tensor  # [1, tokens]
    positions: torch.Tensor  # [1, tokens]
    metadata: AttentionMetadata
    sample_rows: torch.Tensor  # packed rows that sample: 1 + len(item.spec_token_ids) per sampling item
    sampled_items: list[ScheduledRequest]  # in the order of `sample_rows`
    packed: list[ScheduledRequest] = field(default_factory=list)  # every item, in the order of its rows (LoRA)


def padded_tables(items: list[ScheduledRequest]) -> torch.Tensor:
    """[requests, longest table] int32 block tables, -1 where a table is shorter or has a released block."""
    width = max(len(item.block_ids) for item in items)
    tables = torch.full((len(items), width), -1, dtype=torch.int32)
    for row, item in enumerate(items):
        tables[row, :len(item.block_ids)] = torch.tensor(item.block_ids, dtype=torch.int32)
    return tables


class ModelRunner:
    def __init__(self, model: torch.nn.Module, kv_cache: PagedKVCache, backend, device: torch.device,
                 sink_tokens: int = 0, window_tokens: int = 0, rope=None) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.backend = backend
        self.device = device
        self.block_size = kv_cache.layout.block_size
        self.sink_tokens = sink_tokens
        self.window_tokens = window_tokens
        self.rope = rope  # shifted positions: an engine.rope.Rope

    def apply_memory_ops(self, step: SchedulerOutput) -> None:
        """In the order the core prescribes (engine.core.outputs): swap-out, the prefix tiers' demotions and
        promotions, swap-in, copy-on-write."""
        self.kv_cache.swap_out(step.swap_out)
        if step.tier_transfers:
            self.kv_cache.tier_transfers(step.tier_transfers)
        self.kv_cache.swap_in(step.swap_in)
        self.kv_cache.copy_blocks(step.copies)

    def prepare(self, step: SchedulerOutput) -> PreparedStep:
        # shifted positions: one path for all (the decode kernels know no per-query rotation)
        prefills = [item for item in step.scheduled if not item.is_decode or self.rope is not None]
        decodes = [item for item in step.scheduled if item.is_decode and self.rope is None]
        ids: list[int] = []
        positions: list[int] = []
        sample_rows: list[int] = []
        sampled: list[ScheduledRequest] = []
        for item in [*prefills, *decodes]:
            start, n, drafts = item.start_pos, item.num_new_tokens, item.spec_token_ids
            ids.extend(item.request.token_ids[start:start + n - len(drafts)])
            ids.extend(drafts)
            positions.extend(range(start, start + n))
            if item.samples:
                sample_rows.extend(range(len(ids) - 1 - len(drafts), len(ids)))
                sampled.append(item)
        device = self.device
        metadata = self._metadata(prefills, decodes)
        return PreparedStep(torch.tensor([ids], device=device), torch.tensor([positions], device=device), metadata,
                            torch.tensor(sample_rows, dtype=torch.long, device=device), sampled,
                            [*prefills, *decodes])

    def _metadata(self, prefills: list[ScheduledRequest], decodes: list[ScheduledRequest]) -> AttentionMetadata:
        bs, device = self.block_size, self.device
        starts, lens, key_positions, key_slots, slots = [], [], [], [], []
        offset = 0
        for item in prefills:
            start, n = item.start_pos, item.num_new_tokens
            kpos = torch.arange(start + n)
            blocks = torch.tensor(item.block_ids, dtype=torch.long)[kpos // bs]
            held = blocks >= 0  # blocks released by sink+window are never read
            kpos, kslots = kpos[held], (blocks * bs + kpos % bs)[held]
            starts.append(offset)
            lens.append(n)
            key_positions.append(kpos.to(device))
            key_slots.append(kslots.to(device))
            slots.append(kslots[-n:])
            offset += n
        meta = AttentionMetadata(
            torch.empty(0), offset, self.sink_tokens, self.window_tokens, starts, lens, key_positions, key_slots,
            None, None, None, None, None, None, self.rope)
        if prefills:
            meta.prefill_block_tables = padded_tables(prefills).to(device)
            meta.prefill_cu_seqlens = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32,
                                                   device=device)
            meta.prefill_prefix_lens = torch.tensor([i.start_pos for i in prefills], dtype=torch.int32,
                                                    device=device)
        if decodes:
            tables = padded_tables(decodes)
            context = torch.tensor([item.start_pos + 1 for item in decodes])
            last = context - 1
            slots.append(tables.long().gather(1, (last // bs).unsqueeze(1)).squeeze(1) * bs + last % bs)
            key_index = torch.arange(tables.shape[1] * bs)
            mask = meta.visible(key_index, last) & (tables.repeat_interleave(bs, dim=1) >= 0)
            meta.decode_block_tables = tables.to(device)
            meta.decode_context_lens = context.to(torch.int32).to(device)
            meta.decode_key_mask = mask.to(device)
        meta.slot_mapping = torch.cat(slots).to(device)
        return meta

    @torch.inference_mode()
    def forward(self, prepared: PreparedStep) -> torch.Tensor:
        """Logits [sample rows, vocab] (float32): one row per sampling request, 1 + d for one verifying d drafts."""
        context = ForwardContext(prepared.metadata, self.kv_cache.layers, self.backend)
        keep = prepared.sample_rows if len(prepared.sample_rows) else torch.tensor([0], device=self.device)
        with forward_context(context):
            output = self.model(input_ids=prepared.input_ids, position_ids=prepared.positions, use_cache=False,
                                logits_to_keep=keep)
        logits = output.logits[0].float()
        return logits if len(prepared.sample_rows) else logits[:0]
