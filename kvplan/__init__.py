"""kvplan: KV-cache capacity planning for LLM serving."""

__version__ = "0.1.0"
