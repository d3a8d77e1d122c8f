"""Step profiler: one JSONL record per engine step - the input of `kvplan calibrate` and of policy validation.

The first line is `{"meta": {...}}` (model, device, dtype, block size, KV blocks, sink/window, versions). Each
step record holds the batch composition - one item per scheduled request: `[request id, new tokens, start
position, is decode, samples]` - the swap, copy-on-write and prefix-tier (promoted, demoted) block counts, and the
wall time split into schedule /
prepare / forward / sample / update plus the whole step (`wall_s`). A live replay adds the step's start and end on
the trace's clock (`start_s`, `end_s`). Records go to a temporary file that is renamed into place on close, so an
interrupted run never leaves a half-written profile.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from kvplan.engine.core.outputs import SchedulerOutput
from kvplan.engine.core.tier_transfers import num_demotions


def step_record(step: SchedulerOutput, block_size: int, times: dict[str, float],
                spec: dict[str, tuple[int, int]] | None = None, **extra: float) -> dict:
    """One step's record; `spec` (speculative decoding, `UpdateOutput.spec`): request id -> (drafts verified,
    drafts accepted), recorded as `spec` only in steps that verified drafts."""
    items = [[i.request_id, i.num_new_tokens, i.start_pos, i.is_decode, i.samples] for i in step.scheduled]
    return {"step": step.step_id, "block_size": block_size, "items": items,
            "num_batched_tokens": step.num_batched_tokens, "num_copies": len(step.copies),
            "num_swap_out": len(step.swap_out), "num_swap_in": len(step.swap_in),
            "num_promotions": len(step.promotions), "num_demotions": num_demotions(step.tier_transfers),
            "times_s": times, "wall_s": sum(times.values()), **({"spec": spec} if spec else {}), **extra}


class StepProfiler:
    def __init__(self, path: str | Path, meta: dict) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = self.path.with_name(f".{self.path.name}.tmp")
        self._file = self._tmp.open("w")
        self._file.write(json.dumps({"meta": meta}) + "\n")

    def record(self, step: SchedulerOutput, block_size: int, times: dict[str, float],
               spec: dict[str, tuple[int, int]] | None = None, **extra: float) -> None:
        self._file.write(json.dumps(step_record(step, block_size, times, spec, **extra)) + "\n")

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()
            os.replace(self._tmp, self.path)

    def discard(self) -> None:
        """Drop a profile that must not be published (the run failed)."""
        if not self._file.closed:
            self._file.close()
            self._tmp.unlink(missing_ok=True)
