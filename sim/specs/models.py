"""Model architecture specs: the shapes that decide FLOPs, weight bytes and KV bytes per token.

Built-in specs follow the published HF `config.json` of each model; any other model is read from a path to
its `config.json` (Llama/Mistral/Qwen2 and OPT key names). Every field is checked: integers must be integral
and in range (`CONFIG_LIMITS`, far above any published model), booleans are not numbers, the heads must split
the hidden size and the KV heads the heads; each problem is one line `CONFIG: key: problem; allowed: ...`.
"""

from __future__ import annotations

import errno
import json
from dataclasses import dataclass
from pathlib import Path

from kvplan.errors import UserError
from kvplan.traces.schema import short_repr
from kvplan.traces.specs import read_text, shown


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
    # Per-layer attention kind, HF's `layer_types` spelling ("full_attention" or "sliding_attention"); None: every
    # layer attends to the whole context. Sliding layers attend to the last `sliding_window` tokens only.
    layer_types: tuple[str, ...] | None = None
    sliding_window: int | None = None

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
    # the engine's tiny random models (engine/models.py), so that `serve tiny-llama` + `replay --endpoint
    # --model tiny-llama` and `simulate --model tiny-llama` find the model where `serve` does
    _spec("tiny-llama", 2, 64, 4, 2, 128, 512, context_len=512),
    _spec("tiny-qwen2", 2, 64, 4, 2, 128, 512, context_len=512),
    _spec("tiny-gpt2", 2, 64, 4, 4, 256, 512, gated_mlp=False, tied_embeddings=True, context_len=512),
)}

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8": 1, "int8": 1}
# the kv_cache_dtype setting (vLLM's names) -> the simulator's KV dtype (None: the model's own)
_KV_CACHE_DTYPES = {"auto": None, "fp8": "float8", "fp8_e4m3": "float8"}


def sim_kv_dtype(kv_cache_dtype: str) -> str | None:
    return _KV_CACHE_DTYPES.get(kv_cache_dtype, kv_cache_dtype)
# kvplan's engine keeps one float32 scale per token per KV head beside a quantized row (kernels/quant.py); vLLM's
# GPU fp8 cache uses per-tensor scales, so the analytic (GPU) model counts the 1-byte values alone
ENGINE_SCALE_BYTES = 4
QUANTIZED_KV = ("float8", "int8")


def engine_kv_row_bytes(dtype: str, head_dim: int) -> int:
    """Bytes of one token's K (or V) row of one KV head in kvplan's engine cache."""
    return DTYPE_BYTES[dtype] * head_dim + (ENGINE_SCALE_BYTES if dtype in QUANTIZED_KV else 0)


def get_model(name: str) -> ModelSpec:
    """A built-in spec by name, or the spec read from a path to an HF config.json (or its directory)."""
    if name in MODELS:
        return MODELS[name]
    path = Path(name)
    try:
        path.stat()
    except OSError as exc:  # a 5,000-character name: ENAMETOOLONG, which is_dir() raises instead of answering
        if exc.errno == errno.ENAMETOOLONG:
            raise UserError(f"--model: unknown model {short_repr(name)}; allowed: {', '.join(sorted(MODELS))}, "
                            "or a path to an HF config.json") from None
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UserError(f"--model: {path}: a directory without config.json; allowed: a model directory "
                             "or a path to an HF config.json")
        path = path / "config.json"
    if path.suffix == ".json":
        if not path.exists():  # a ValueError like an unknown name: a calibrated run may name the model as a label
            raise UserError(f"--model: {path}: no such file; allowed: {', '.join(sorted(MODELS))}, "
                             "or a path to an HF config.json")
        return from_hf_config(path)
    raise UserError(f"--model: unknown model {short_repr(name)}; allowed: {', '.join(sorted(MODELS))}, "
                     "or a path to an HF config.json")


REQUIRED = "hidden_size, num_attention_heads, num_hidden_layers, intermediate_size (or ffn_dim), vocab_size"
# The largest value each size may take: generous bounds (the largest published models use a hidden size of
# ~25k, 128 heads, ~200 layers and a vocabulary of ~260k), so that only typos and junk are refused.
CONFIG_LIMITS = {"num_hidden_layers": 4096, "hidden_size": 2**20, "num_attention_heads": 2**14,
                 "num_key_value_heads": 2**14, "head_dim": 2**16, "intermediate_size": 2**22, "ffn_dim": 2**22,
                 "vocab_size": 2**24}


def read_config(path: Path) -> dict:
    """The config.json at `path` as a dict; unreadable, non-UTF-8 and invalid JSON are one line naming it."""
    text = read_text(path, "--model")
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}:{exc.lineno}:{exc.colno}: not valid JSON: {exc.msg}") from None
    except RecursionError:
        raise UserError(f"{path}: not valid JSON: nested too deeply; allowed: an HF config.json object") from None
    if not isinstance(cfg, dict):
        raise UserError(f"{path}: a config.json is a JSON object with {REQUIRED}; got a {type(cfg).__name__}")
    return cfg


def _size(path: Path, cfg: dict, key: str) -> int:
    """A positive integral size (32 or 32.0; not 32.5, "32", true, NaN or 0), at most its `CONFIG_LIMITS`."""
    value, limit = cfg[key], CONFIG_LIMITS[key]
    integral = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if isinstance(value, bool) or not integral or not 1 <= value <= limit:
        raise UserError(f"{path}: {key}: must be an integer >= 1, got {shown(value)}; allowed: 1 to {limit}")
    return int(value)


def _given(cfg: dict, key: str) -> bool:
    return cfg.get(key) is not None  # HF writes null for "not set"


def from_hf_config(path: Path) -> ModelSpec:
    cfg = read_config(path)
    inter_key = "intermediate_size" if _given(cfg, "intermediate_size") else "ffn_dim"
    missing = next((k for k in ("hidden_size", "num_attention_heads", "num_hidden_layers", inter_key, "vocab_size")
                    if not _given(cfg, k)), None)
    if missing is not None:
        raise UserError(f"{path}: config.json lacks {missing!r}; needs {REQUIRED}")
    hidden, heads = _size(path, cfg, "hidden_size"), _size(path, cfg, "num_attention_heads")
    opt = _model_type(path, cfg) == "opt"
    return ModelSpec(
        name=str(path), num_layers=_size(path, cfg, "num_hidden_layers"), hidden_size=hidden, num_heads=heads,
        num_kv_heads=_kv_heads(path, cfg, heads), head_dim=_head_dim(path, cfg, hidden, heads),
        intermediate_size=_size(path, cfg, inter_key), vocab_size=_size(path, cfg, "vocab_size"),
        dtype_bytes=_dtype_bytes(path, cfg), gated_mlp=not opt,
        tied_embeddings=_flag(path, cfg, "tie_word_embeddings", opt), context_len=_context_len(path, cfg))


def _head_dim(path: Path, cfg: dict, hidden: int, heads: int) -> int:
    if _given(cfg, "head_dim"):
        return _size(path, cfg, "head_dim")
    if hidden % heads:
        raise UserError(f"{path}: hidden_size: {hidden} is not divisible by num_attention_heads {heads}; allowed: "
                         "a multiple of num_attention_heads, or an explicit head_dim")
    return hidden // heads


def _kv_heads(path: Path, cfg: dict, heads: int) -> int:
    if not _given(cfg, "num_key_value_heads"):
        return heads  # multi-head attention: one KV head per query head
    kv_heads = _size(path, cfg, "num_key_value_heads")
    if heads % kv_heads:
        divisors = [d for d in range(1, heads + 1) if heads % d == 0]
        shown_divisors = ", ".join(map(str, divisors[:16])) + (", ..." if len(divisors) > 16 else "")
        raise UserError(f"{path}: num_key_value_heads: {kv_heads} does not divide num_attention_heads {heads}; "
                         f"allowed: {shown_divisors}")
    return kv_heads


def _dtype_bytes(path: Path, cfg: dict) -> int:
    """Weight bytes per parameter from `torch_dtype` (or the newer `dtype`); 2 when neither is given."""
    key = next((k for k in ("torch_dtype", "dtype") if _given(cfg, k)), None)
    if key is None:
        return 2
    if not isinstance(cfg[key], str) or cfg[key] not in DTYPE_BYTES:
        raise UserError(f"{path}: {key}: unknown dtype {shown(cfg[key])}; allowed: {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[cfg[key]]


def _model_type(path: Path, cfg: dict) -> str | None:
    value = cfg.get("model_type")
    if value is not None and not isinstance(value, str):
        raise UserError(f"{path}: model_type: must be a string, got {shown(value)}; allowed: e.g. llama, opt")
    return value


def _flag(path: Path, cfg: dict, key: str, default: bool) -> bool:
    value = cfg.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):  # "false" would be truthy
        raise UserError(f"{path}: {key}: must be true or false, got {shown(value)}; allowed: true, false")
    return value


def _context_len(path: Path, cfg: dict) -> int | None:
    key = next((k for k in ("max_position_embeddings", "n_positions") if cfg.get(k) is not None), None)
    if key is None:
        return None
    value = cfg[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 2:
        raise UserError(f"{path}: {key}: {shown(value)}; allowed: an integer >= 2 (the model's context length)")
    return value
