"""Loaders for the public trace formats and our own, by name."""

from kvplan.traces.loaders.azure import AZURE, AZURE_MULTIMODAL
from kvplan.traces.loaders.burstgpt import BURSTGPT
from kvplan.traces.loaders.hashed import MOONCAKE, QWEN_BAILIAN
from kvplan.traces.loaders.native import KVPLAN_CSV, KVPLAN_JSONL, KVPLAN_PARQUET
from kvplan.traces.loaders.options import LoadOptions
from kvplan.traces.loaders.spec import Format
from kvplan.traces.loaders.vidur import LENGTHS, SPLITWISE, VIDUR
from kvplan.traces.loaders.vllm_bench import VLLM_BENCH

FORMATS: dict[str, Format] = {f.name: f for f in (
    AZURE, AZURE_MULTIMODAL, MOONCAKE, QWEN_BAILIAN, BURSTGPT, VIDUR, SPLITWISE, LENGTHS, VLLM_BENCH, KVPLAN_JSONL,
    KVPLAN_CSV, KVPLAN_PARQUET)}

__all__ = ["FORMATS", "Format", "LoadOptions"]
