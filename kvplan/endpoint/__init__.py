"""Replay a trace against any OpenAI-compatible endpoint (vLLM, SGLang, TGI, `kvplan serve`) and read its
latencies into the simulator's tables."""
