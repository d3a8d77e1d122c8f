"""`kvplan serve`: the live engine behind an OpenAI-compatible HTTP API (FastAPI + uvicorn)."""
