"""Step profiler: one JSONL record per engine step - the input of `kvplan calibrate`.

Each record holds the batch composition (per prefill: new tokens and the cached prefix they attend to; per
decode: its context length), the block size and blocks touched, and the wall time split into schedule /
prepare / forward / sample / update. Records go to a temporary file that is renamed into place on close, so an
interrupted run never leaves a half-written profile.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from engine.core.outputs import SchedulerOutput


def step_record(step: SchedulerOutput, block_size: int, times: dict[str, float]) -> dict:
    prefills = [{"new_tokens": i.num_new_tokens, "cached_prefix": i.start_pos} for i in step.scheduled
                if not i.is_decode]
    decodes = [i.start_pos + 1 for i in step.scheduled if i.is_decode]
    blocks = sum(sum(1 for b in i.block_ids if b >= 0) for i in step.scheduled)
    return {"step": step.step_id, "block_size": block_size, "prefill": prefills, "decode_context_lens": decodes,
            "num_batched_tokens": step.num_batched_tokens, "blocks_touched": blocks,
            "num_copies": len(step.copies), "num_swap_out": len(step.swap_out), "num_swap_in": len(step.swap_in),
            "times_s": times}


class StepProfiler:
    def __init__(self, path: str | Path, meta: dict) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = self.path.with_name(f".{self.path.name}.tmp")
        self._file = self._tmp.open("w")
        self._file.write(json.dumps({"meta": meta}) + "\n")

    def record(self, step: SchedulerOutput, block_size: int, times: dict[str, float]) -> None:
        self._file.write(json.dumps(step_record(step, block_size, times)) + "\n")

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()
            os.replace(self._tmp, self.path)
