"""JSONL traces with prefix hashes: Mooncake / Kimi (FAST'25) and Qwen-Bailian ("KVCache in the wild").

Mooncake: `timestamp` (ms), `input_length`, `output_length`, `hash_ids` (one per 512-token block, the last one
partial: exactly ceil(input_length / 512) of them in every row of the published traces; files without `hash_ids`
load without prefix identity).
Qwen-Bailian: `chat_id`, `parent_chat_id` (-1 for a first turn), `timestamp` (s), `input_length`,
`output_length`, `type`, `turn`, `hash_ids` (one per 16-token block).
"""

from __future__ import annotations

import numpy as np

from kvplan.traces.loaders.options import LoadOptions
from kvplan.traces.loaders.rows import Rows
from kvplan.traces.loaders.spec import Field, jsonl_format
from kvplan.traces.schema import LoadReport

MOONCAKE = jsonl_format(
    "mooncake",
    (Field("arrival_s", "timestamp", per_second=1000, integer=False),
     Field("prompt_tokens", "input_length", minimum=1),
     Field("output_tokens", "output_length")),
    "Mooncake / Kimi FAST'25 JSONL (512-token hash_ids)",
    hashes="hash_ids", granularity=512, hash_count="exact",
)


def _sessions(rows: Rows, columns: dict[str, np.ndarray], opts: LoadOptions, report: LoadReport) -> None:
    """A conversation is the chain of parent_chat_id links; its session id is the chain's first chat_id."""
    ids = columns["request_id"].tolist()
    parent_of = dict(zip(ids, columns.pop("_parent").tolist(), strict=True))
    root: dict[float, float] = {}
    for chat in ids:
        path = [chat]
        # Follow links up to a first turn, or to a parent outside the file (a sampled trace); the length
        # bound stops a malformed cycle.
        while path[-1] not in root and parent_of.get(path[-1], -1) >= 0 and len(path) <= len(ids):
            path.append(parent_of[path[-1]])
        top = root.get(path[-1], path[-1])
        root.update(dict.fromkeys(path, top))
    columns["session_id"] = np.array([root[c] for c in ids], dtype=np.float64)


QWEN_BAILIAN = jsonl_format(
    "qwen-bailian",
    (Field("request_id", "chat_id"),
     Field("_parent", "parent_chat_id", minimum=-1),
     Field("arrival_s", "timestamp", integer=False),
     Field("prompt_tokens", "input_length", minimum=1),
     Field("output_tokens", "output_length"),
     Field("turn", "turn")),
    "Qwen-Bailian 'KVCache in the wild' JSONL (16-token hash_ids, conversation chains)",
    hashes="hash_ids", granularity=16, adjust=_sessions, extra_required=("type",),
)
