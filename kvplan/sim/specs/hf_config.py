"""Read an HF `config.json` into a `ModelSpec`: the keys of dense (Llama, Mistral, Qwen2/3, OPT), MoE (Mixtral,
Qwen3-MoE, DeepSeek, gpt-oss), MLA (DeepSeek-V2/V3) and hybrid sliding-window (Gemma 3, gpt-oss) models, and a
multimodal config's `text_config`.

Every field is checked: integers must be integral and in range (`CONFIG_LIMITS`, far above any published model),
booleans are not numbers, the heads must split the hidden size and the KV heads the heads; each problem is one
line `CONFIG: key: problem; allowed: ...`. An architecture the cost model cannot price (state-space or linear
attention layers, MoE layers interleaved with dense ones, an unknown weight quantization) is refused the same
way, naming the key that says so - never priced as something it is not. A `quantization_config` (fp8, awq, gptq,
mxfp4) sets the weights' bytes and GEMM kind from the one table of methods, `sim.specs.quantization`.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from kvplan.errors import UserError
from kvplan.sim.specs.arch import DTYPE_BYTES, ModelSpec
from kvplan.sim.specs.quantization import METHODS, Quantization, int_weight_bytes, with_method
from kvplan.traces.specs import read_text, shown

REQUIRED = "hidden_size, num_attention_heads, num_hidden_layers, intermediate_size (or ffn_dim), vocab_size"
# The largest value each size may take: generous bounds (the largest published models use a hidden size of
# ~25k, 128 heads, ~200 layers and a vocabulary of ~260k), so that only typos and junk are refused.
CONFIG_LIMITS = {"num_hidden_layers": 4096, "hidden_size": 2**20, "num_attention_heads": 2**14,
                 "num_key_value_heads": 2**14, "head_dim": 2**16, "intermediate_size": 2**22, "ffn_dim": 2**22,
                 "vocab_size": 2**24, "num_local_experts": 2**16, "num_experts": 2**16, "n_routed_experts": 2**16,
                 "num_experts_per_tok": 2**16, "experts_per_token": 2**16, "n_shared_experts": 2**10,
                 "moe_intermediate_size": 2**22, "shared_expert_intermediate_size": 2**24,
                 "first_k_dense_replace": 4096, "kv_lora_rank": 2**16, "q_lora_rank": 2**16,
                 "qk_rope_head_dim": 2**16, "qk_nope_head_dim": 2**16, "v_head_dim": 2**16,
                 "sliding_window": 2**31, "sliding_window_pattern": 4096}
LAYER_KINDS = ("full_attention", "sliding_attention")
# Keys that mean layers other than softmax attention over a KV cache (Mamba / Jamba / Falcon-H1 state-space
# layers, Qwen3-Next linear attention): kvplan's KV arithmetic does not hold for them.
UNPRICEABLE_KEYS = {"ssm_state_size": "state-space (Mamba) layers", "state_size": "state-space (Mamba) layers",
                    "mamba_d_state": "state-space (Mamba) layers", "linear_num_key_heads": "linear-attention layers",
                    "linear_key_head_dim": "linear-attention layers"}
# The bits and group sizes of AWQ / GPTQ checkpoints vLLM's Marlin kernels run (`sim.specs.quantization`).
INT_BITS, INT_GROUPS = (4, 8), (-1, 32, 64, 128)


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
    cfg = _text_config(path, read_config(path))
    _refuse_unpriceable(path, cfg)
    inter_key = "intermediate_size" if _given(cfg, "intermediate_size") else "ffn_dim"
    missing = next((k for k in ("hidden_size", "num_attention_heads", "num_hidden_layers", inter_key, "vocab_size")
                    if not _given(cfg, k)), None)
    if missing is not None:
        raise UserError(f"{path}: config.json lacks {missing!r}; needs {REQUIRED}")
    hidden, heads = _size(path, cfg, "hidden_size"), _size(path, cfg, "num_attention_heads")
    layers, inter = _size(path, cfg, "num_hidden_layers"), _size(path, cfg, inter_key)
    opt = _model_type(path, cfg) == "opt"
    method = _quantization(path, cfg)
    mla = _mla(path, cfg)
    layer_types, window = _layer_kinds(path, cfg, layers)
    spec = ModelSpec(
        name=str(path), num_layers=layers, hidden_size=hidden, num_heads=heads,
        num_kv_heads=_kv_heads(path, cfg, heads),
        head_dim=mla["qk_nope_head_dim"] + mla["qk_rope_head_dim"] if mla else _head_dim(path, cfg, hidden, heads),
        intermediate_size=inter, vocab_size=_size(path, cfg, "vocab_size"),
        dtype_bytes=_dtype_bytes(path, cfg), gated_mlp=not opt,
        tied_embeddings=_flag(path, cfg, "tie_word_embeddings", opt), context_len=_context_len(path, cfg),
        layer_types=layer_types, sliding_window=window, **_moe(path, cfg, layers, inter), **mla)
    return spec if method is None else with_method(spec, method)


def _text_config(path: Path, cfg: dict) -> dict:
    """A multimodal config (Gemma 3, Llama 4): the language model's `text_config`, with the outer dtype."""
    text = cfg.get("text_config")
    if text is None or _given(cfg, "hidden_size"):
        return cfg
    if not isinstance(text, dict):
        raise UserError(f"{path}: text_config: must be an object, got {shown(text)}; allowed: the language "
                         "model's config")
    outer = {k: cfg[k] for k in ("torch_dtype", "dtype", "quantization_config") if k in cfg}
    return {**outer, **text}


def _refuse_unpriceable(path: Path, cfg: dict) -> None:
    for key, what in UNPRICEABLE_KEYS.items():
        if _given(cfg, key):
            raise UserError(f"{path}: {key}: the model has {what}, which kvplan cannot price; allowed: models of "
                             "softmax-attention layers (dense, MoE, MLA, sliding-window)")
    if cfg.get("is_encoder_decoder") is True:
        raise UserError(f"{path}: is_encoder_decoder: an encoder-decoder model, which kvplan cannot price; "
                         "allowed: decoder-only models")


def _optional_size(path: Path, cfg: dict, key: str) -> int:
    return _size(path, cfg, key) if _given(cfg, key) else 0


def _first_key(cfg: dict, keys: tuple[str, ...]) -> str | None:
    return next((k for k in keys if _given(cfg, k)), None)


def _moe(path: Path, cfg: dict, layers: int, inter: int) -> dict:
    """MoE fields (none for a dense model): experts, experts per token, shared experts and their width."""
    experts_key = _first_key(cfg, ("num_local_experts", "num_experts", "n_routed_experts"))
    if experts_key is None or cfg[experts_key] == 0:
        return {}
    experts = _size(path, cfg, experts_key)
    per_token_key = _first_key(cfg, ("num_experts_per_tok", "experts_per_token"))
    if per_token_key is None:
        raise UserError(f"{path}: config.json lacks 'num_experts_per_tok' beside {experts_key}; needs the "
                         "experts each token is routed to")
    per_token = _size(path, cfg, per_token_key)
    if per_token > experts:
        raise UserError(f"{path}: {per_token_key}: {per_token} exceeds {experts_key} {experts}; allowed: 1 to "
                         f"{experts}")
    width = _optional_size(path, cfg, "moe_intermediate_size") or inter  # Mixtral, gpt-oss: intermediate_size
    shared = _optional_size(path, cfg, "n_shared_experts")
    if _given(cfg, "shared_expert_intermediate_size"):  # Qwen2-MoE: one shared expert of its own width
        size = _size(path, cfg, "shared_expert_intermediate_size")
        if size % width:
            raise UserError(f"{path}: shared_expert_intermediate_size: {size} is not a multiple of the expert "
                             f"width {width}; allowed: a multiple of moe_intermediate_size")
        shared = size // width
    dense = _optional_size(path, cfg, "first_k_dense_replace")
    if dense > layers:
        raise UserError(f"{path}: first_k_dense_replace: {dense} exceeds num_hidden_layers {layers}; allowed: 0 "
                         f"to {layers}")
    interleaved = [(k, cfg[k]) for k in ("decoder_sparse_step", "moe_layer_freq") if cfg.get(k) not in (None, 1)]
    if cfg.get("mlp_only_layers"):
        interleaved.append(("mlp_only_layers", cfg["mlp_only_layers"]))
    if interleaved:  # dense layers between MoE layers: the leading-dense-layers shape does not hold
        key, value = interleaved[0]
        raise UserError(f"{path}: {key}: {shown(value)}: dense layers between MoE layers, which kvplan cannot "
                         "price; allowed: decoder_sparse_step / moe_layer_freq 1 and no mlp_only_layers (leading "
                         "dense layers: first_k_dense_replace)")
    return {"num_experts": experts, "experts_per_token": per_token, "shared_experts": shared,
            "moe_intermediate_size": width, "dense_layers": dense}


def _mla(path: Path, cfg: dict) -> dict:
    """Multi-head latent attention fields (DeepSeek-V2/V3); none without `kv_lora_rank`."""
    if not _given(cfg, "kv_lora_rank"):
        return {}
    needed = ("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
    missing = next((k for k in needed if not _given(cfg, k)), None)
    if missing is not None:
        raise UserError(f"{path}: config.json lacks {missing!r} beside kv_lora_rank; needs {', '.join(needed)}")
    return {"kv_lora_rank": _size(path, cfg, "kv_lora_rank"), "q_lora_rank": _optional_size(path, cfg, "q_lora_rank"),
            **{k: _size(path, cfg, k) for k in needed}}


def _quantization(path: Path, cfg: dict) -> Quantization | None:
    """The weight quantization a checkpoint declares (`sim.specs.quantization.METHODS`), an AWQ / GPTQ one at its
    own bits and group size; None: the dtype's weights."""
    quant = cfg.get("quantization_config")
    if quant is None:
        return None
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    if method not in METHODS:
        raise UserError(f"{path}: quantization_config.quant_method: {shown(method)}, whose bytes per weight kvplan "
                         f"does not know; allowed: {', '.join(METHODS)}")
    assert isinstance(quant, dict)
    if method not in ("awq", "gptq"):
        return METHODS[method]
    bits, group = quant.get("bits", 4), quant.get("group_size", 128)
    for key, value, allowed in (("bits", bits, INT_BITS), ("group_size", group, INT_GROUPS)):
        if isinstance(value, bool) or value not in allowed:
            raise UserError(f"{path}: quantization_config.{key}: {shown(value)}, which vLLM's Marlin kernels do not "
                             f"run; allowed: {', '.join(map(str, allowed))}")
    # AWQ's groups carry a zero point unless zero_point is false; GPTQ's only when asymmetric (sym false)
    zeros = quant.get("zero_point", True) is not False if method == "awq" else quant.get("sym", True) is False
    return replace(METHODS[method], weight_bytes=int_weight_bytes(bits, group, zeros))


def _layer_kinds(path: Path, cfg: dict, layers: int) -> tuple[tuple[str, ...] | None, int | None]:
    """Per-layer attention kinds and the window: HF `layer_types`, or Gemma's `sliding_window_pattern` (every
    N-th layer full), or a `sliding_window` on every layer (Mistral v0.1), unless `use_sliding_window` is false
    (Qwen2/3 state a window they do not use)."""
    if cfg.get("use_sliding_window") is False:
        return None, None
    window = _optional_size(path, cfg, "sliding_window") or None
    kinds = cfg.get("layer_types")
    if kinds is not None:
        if not isinstance(kinds, list) or len(kinds) != layers:
            raise UserError(f"{path}: layer_types: must be a list of {layers} kinds (num_hidden_layers), got "
                             f"{shown(kinds)}; allowed: {', '.join(LAYER_KINDS)}")
        bad = next((i for i, kind in enumerate(kinds) if kind not in LAYER_KINDS), None)
        if bad is not None:
            raise UserError(f"{path}: layer_types: {shown(kinds[bad])} at index {bad}, which kvplan cannot price; "
                             f"allowed: {', '.join(LAYER_KINDS)}")
        kinds = tuple(kinds)
    elif window is not None and _given(cfg, "sliding_window_pattern"):
        every = _size(path, cfg, "sliding_window_pattern")
        kinds = tuple("full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(layers))
    elif window is not None:
        kinds = ("sliding_attention",) * layers
    if kinds is not None and "sliding_attention" in kinds and window is None:
        raise UserError(f"{path}: sliding_window: not given, but layer_types has sliding layers; allowed: the "
                         "window in tokens, an integer >= 1")
    return kinds, window


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
