"""Small trace files in the exact published layouts, written into a test's tmp_path."""

from __future__ import annotations

import json
from pathlib import Path

AZURE_2023 = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:51.0000000,879,28
"""

AZURE_2024 = """TIMESTAMP,ContextTokens,GeneratedTokens
2024-05-10 00:00:00+00:00,2048,13
2024-05-10 00:00:00.009930+00:00,1200,300
2024-05-10 00:00:02.5+00:00,77,1
"""

BURSTGPT = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
45,ChatGPT,1087,0,1087,Conversation log
118,GPT-4,417,217,634,API log
"""

BURSTGPT_V3 = """Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type
0.5,17,1.25,ChatGPT,300,20,320,Conversation log
2.0,17,0.75,ChatGPT,350,0,350,Conversation log
3.0,,2.5,GPT-4,90,40,130,API log
"""

VIDUR = """arrived_at,num_prefill_tokens,num_decode_tokens
0.0,100,20
0.25,2048,7
1.5,300,300
"""

LENGTHS = """num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio
74,918,992,0.0806100217864923
290,905,1195,0.3204419889502762
"""

MOONCAKE = [
    {"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": list(range(14))},
    {"timestamp": 0, "input_length": 1030, "output_length": 490, "hash_ids": [0, 14, 15]},
    {"timestamp": 3000, "input_length": 6955, "output_length": 52,
     "hash_ids": [*range(12), 2353, 2354]},
]

QWEN = [
    {"chat_id": 159, "parent_chat_id": -1, "timestamp": 61.114, "input_length": 521, "output_length": 132,
     "type": "text", "turn": 1, "hash_ids": list(range(33))},
    {"chat_id": 160, "parent_chat_id": -1, "timestamp": 61.2, "input_length": 40, "output_length": 9,
     "type": "image", "turn": 1, "hash_ids": [900, 901, 902]},
    {"chat_id": 201, "parent_chat_id": 159, "timestamp": 90.5, "input_length": 700, "output_length": 80,
     "type": "text", "turn": 2, "hash_ids": [*range(32), *range(1000, 1012)]},
    {"chat_id": 305, "parent_chat_id": 201, "timestamp": 120.0, "input_length": 800, "output_length": 10,
     "type": "text", "turn": 3, "hash_ids": [*range(32), 2000, 2001]},
]


def write_text(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def jsonl_text(objects: list[dict]) -> str:
    return "".join(json.dumps(o) + "\n" for o in objects)


def write_jsonl(tmp_path: Path, name: str, objects: list[dict]) -> Path:
    return write_text(tmp_path, name, jsonl_text(objects))


# BurstGPT_1 as published: a failed request has 0 request tokens and 0 response tokens.
BURSTGPT_FAILED = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
45,ChatGPT,0,0,0,Conversation log
46,ChatGPT,1087,0,1087,Conversation log
118,GPT-4,417,217,634,API log
120,GPT-4,0,0,0,API log
"""

# BurstGPT excerpts without `Log Type` (and `Total tokens`).
BURSTGPT_NO_LOG_TYPE = """Timestamp,Model,Request tokens,Response tokens
5,ChatGPT,472,18
118,GPT-4,417,217
"""

# splitwise-sim's request CSV (traces/test_trace.csv layout).
SPLITWISE = """request_id,request_type,application_id,arrival_timestamp,batch_size,prompt_size,token_size
0,2,0,1,1,4096,32
1,2,0,3,1,2048,8
2,2,0,4.5,1,2048,16
"""

# Azure LMM inference trace 2025 (AzureLMMInferenceTrace_multimodal.csv.gz, decompressed).
AZURE_2025 = """TIMESTAMP,NumImages,ContextTokens,GeneratedTokens
2024-10-15T12:00:00.269Z,0,770,491
2024-10-15T12:00:05.819Z,1,949,126
2024-10-15T12:00:06Z,3,964,79
"""

MOONCAKE_NO_HASHES = [{k: v for k, v in r.items() if k != "hash_ids"} for r in MOONCAKE]

# A Mooncake-layout file whose hash_ids are 16-token blocks (ceil(input / 16) per row).
MOONCAKE_16 = [
    {"timestamp": 0, "input_length": 100, "output_length": 5, "hash_ids": list(range(7))},
    {"timestamp": 1000, "input_length": 40, "output_length": 5, "hash_ids": [0, 1, 7]},
    {"timestamp": 2000, "input_length": 1030, "output_length": 5, "hash_ids": list(range(100, 165))},
]
