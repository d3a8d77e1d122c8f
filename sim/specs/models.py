"""Model architecture specs: the shapes that decide FLOPs, weight bytes and KV bytes per token.

Built-in specs follow the published HF `config.json` of each model; any other model is read from a path to
its `config.json` (Llama/Mistral/Qwen2 and OPT key names).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(slots=True, frozen=True)
class ModelSpec:
    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    dtype_bytes: int = 2
    gated_mlp: bool = True  # SwiGLU (three MLP matrices) vs a plain two-matrix MLP (OPT)
    tied_embeddings: bool = False
    # The context length (HF `max_position_embeddings`): vLLM's default and upper bound for max_model_len.
    # None: not stated (a config.json without it), so only the workload bounds it.
    context_len: int | None = None

    @property
    def layer_params(self) -> int:
        attn = self.hidden_size * self.head_dim * (2 * self.num_heads + 2 * self.num_kv_heads)
        mlp = (3 if self.gated_mlp else 2) * self.hidden_size * self.intermediate_size
        return attn + mlp

    @property
    def num_params(self) -> int:
        embed = self.vocab_size * self.hidden_size
        return self.num_layers * self.layer_params + embed * (1 if self.tied_embeddings else 2)

    @property
    def layer_matmul_params(self) -> int:
        """Parameters of every layer's GEMMs (q, k, v, o and the MLP): every token in a step multiplies through them."""
        return self.num_layers * self.layer_params

    @property
    def lm_head_params(self) -> int:
        """The LM head (vocab × hidden; the embedding table itself when tied): only sampled rows multiply through it."""
        return self.vocab_size * self.hidden_size

    @property
    def matmul_params(self) -> int:
        """Parameters a sampled token multiplies through (all layers plus the LM head; not the embedding lookup)."""
        return self.layer_matmul_params + self.lm_head_params

    @property
    def weight_bytes(self) -> int:
        return self.num_params * self.dtype_bytes

    def kv_bytes_per_token(self, kv_dtype_bytes: float | None = None) -> float:
        """K and V of one token in every layer (e.g. Llama-2-7B fp16: 2*32*32*128*2 = 524,288 bytes)."""
        width = self.dtype_bytes if kv_dtype_bytes is None else kv_dtype_bytes
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * width


def _spec(name: str, layers: int, hidden: int, heads: int, kv_heads: int, inter: int, vocab: int, **kw) -> ModelSpec:
    return ModelSpec(name, layers, hidden, heads, kv_heads, hidden // heads, inter, vocab, **kw)


# Context lengths are each model's published `max_position_embeddings` (Mistral-7B v0.1: 32768, with a
# 4096-token sliding window that kvplan does not model by default; Qwen2.5-7B: 32768; SmolLM2: 8192).
MODELS: dict[str, ModelSpec] = {spec.name: spec for spec in (
    _spec("llama-2-7b", 32, 4096, 32, 32, 11008, 32000, context_len=4096),
    _spec("llama-2-13b", 40, 5120, 40, 40, 13824, 32000, context_len=4096),
    _spec("llama-3-8b", 32, 4096, 32, 8, 14336, 128256, context_len=8192),
    _spec("llama-3-70b", 80, 8192, 64, 8, 28672, 128256, context_len=8192),
    _spec("qwen2.5-7b", 28, 3584, 28, 4, 18944, 152064, context_len=32768),
    _spec("mistral-7b", 32, 4096, 32, 8, 14336, 32000, context_len=32768),
    _spec("opt-13b", 40, 5120, 40, 40, 20480, 50272, gated_mlp=False, tied_embeddings=True, context_len=2048),
    _spec("smollm2-135m", 30, 576, 9, 3, 1536, 49152, tied_embeddings=True, context_len=8192),
    # the engine's random benchmark model (engine/models.py)
    _spec("llama-100m", 12, 768, 12, 4, 2048, 32000, tied_embeddings=True, context_len=2048),
)}

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8": 1, "int8": 1}


def get_model(name: str) -> ModelSpec:
    """A built-in spec by name, or the spec read from a path to an HF config.json (or its directory)."""
    if name in MODELS:
        return MODELS[name]
    path = Path(name)
    if path.is_dir():
        path = path / "config.json"
    if path.suffix == ".json" and path.is_file():
        return from_hf_config(path)
    raise ValueError(f"--model: unknown model {name!r}; allowed: {', '.join(sorted(MODELS))}, "
                     "or a path to an HF config.json")


def from_hf_config(path: Path) -> ModelSpec:
    cfg = json.loads(path.read_text())
    try:
        hidden = cfg["hidden_size"]
        heads = cfg["num_attention_heads"]
        layers = cfg["num_hidden_layers"]
        inter = cfg.get("intermediate_size") or cfg["ffn_dim"]
        vocab = cfg["vocab_size"]
    except KeyError as exc:
        raise ValueError(f"{path}: config.json lacks {exc.args[0]!r}; needs hidden_size, num_attention_heads, "
                         "num_hidden_layers, intermediate_size (or ffn_dim), vocab_size") from None
    opt = cfg.get("model_type") == "opt"
    return ModelSpec(
        name=str(path), num_layers=layers, hidden_size=hidden, num_heads=heads,
        num_kv_heads=cfg.get("num_key_value_heads") or heads, head_dim=cfg.get("head_dim") or hidden // heads,
        intermediate_size=inter, vocab_size=vocab, dtype_bytes=DTYPE_BYTES.get(cfg.get("torch_dtype"), 2),
        gated_mlp=not opt, tied_embeddings=bool(cfg.get("tie_word_embeddings", opt)),
        context_len=_context_len(path, cfg))


def _context_len(path: Path, cfg: dict) -> int | None:
    key = next((k for k in ("max_position_embeddings", "n_positions") if cfg.get(k) is not None), None)
    if key is None:
        return None
    value = cfg[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 2:
        raise ValueError(f"{path}: {key}: {value!r}; allowed: an integer >= 2 (the model's context length)")
    return value
