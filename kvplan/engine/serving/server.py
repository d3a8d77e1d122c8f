"""Run the OpenAI-compatible server: the engine thread plus uvicorn, started and stopped together."""

from __future__ import annotations

from kvplan.engine.llm import LLM
from kvplan.engine.serving.app import build_app
from kvplan.engine.serving.async_engine import AsyncEngine
from kvplan.engine.serving.metrics import ServingMetrics


def make_engine(llm: LLM, model_name: str, max_queue_len: int) -> AsyncEngine:
    """The engine loop with its metrics; `vllm:cache_config_info` carries the KV facts a simulator needs."""
    meta = llm.profile_meta
    info = {"block_size": meta["block_size"], "num_gpu_blocks": meta["num_blocks"],
            "num_cpu_blocks": meta["num_cpu_blocks"], "cache_dtype": meta["kv_dtype"],
            "enable_prefix_caching": llm.scheduler.cache_config.enable_prefix_caching,
            "max_model_len": llm.max_model_len}
    return AsyncEngine(llm, ServingMetrics(model_name, info), max_queue_len=max_queue_len)


def serve(llm: LLM, model_name: str, *, host: str = "127.0.0.1", port: int = 8000, max_queue_len: int = 1024,
          log_level: str = "info") -> None:
    """Serve until interrupted (SIGINT/SIGTERM: uvicorn drains connections, then the engine thread stops)."""
    import uvicorn

    engine = make_engine(llm, model_name, max_queue_len)
    config = uvicorn.Config(build_app(engine, model_name), host=host, port=port, log_level=log_level,
                            access_log=False, timeout_graceful_shutdown=5)
    engine.start()
    try:
        uvicorn.Server(config).run()
    finally:
        engine.stop()
