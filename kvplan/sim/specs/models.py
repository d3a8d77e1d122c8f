"""Built-in model specs and `get_model` (a built-in name, or a path to an HF config.json).

Built-in specs follow the published HF `config.json` of each model (the source is named beside each group); any
other model is read from a path to its `config.json` (`hf_config`: dense Llama/Mistral/Qwen/OPT, MoE and MLA key
names, `layer_types` / `sliding_window`), every key checked, each problem one line `CONFIG: key: problem;
allowed: ...`.
"""

from __future__ import annotations

import errno
from pathlib import Path

from kvplan.engine.core.names import did_you_mean
from kvplan.errors import UserError
from kvplan.sim.specs.arch import DTYPE_BYTES, ModelSpec
from kvplan.sim.specs.hf_config import from_hf_config
from kvplan.sim.specs.quantization import METHODS, with_method
from kvplan.traces.schema import short_repr

__all__ = ["DTYPE_BYTES", "MODELS", "ModelSpec", "from_hf_config", "get_model"]


def _spec(name: str, layers: int, hidden: int, heads: int, kv_heads: int, inter: int, vocab: int, *,
          head_dim: int | None = None, quantization: str | None = None, **kw) -> ModelSpec:
    """A spec; `quantization`: the method the published checkpoint is stored in (its quantization_config)."""
    spec = ModelSpec(name, layers, hidden, heads, kv_heads, head_dim or hidden // heads, inter, vocab, **kw)
    return with_method(spec, METHODS[quantization]) if quantization else spec


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
    # facebook/opt-66b config.json (ffn_dim 36864, max_position_embeddings 2048): DistServe's (OSDI'24) 66B model
    _spec("opt-66b", 64, 9216, 72, 72, 36864, 50272, gated_mlp=False, tied_embeddings=True, context_len=2048),
    # meta-llama/Llama-2-70b-hf config.json (GQA: 8 KV heads; max_position_embeddings 4096): Splitwise's Llama-70B
    _spec("llama-2-70b", 80, 8192, 64, 8, 28672, 32000, context_len=4096),
    # bigscience/bloom config.json (n_layer 70, n_head 112, MHA; GELU MLP of 4 x hidden; word embeddings tied to the
    # head; ALiBi, so no max_position_embeddings: the context is left unstated): Splitwise's (ISCA'24) main model
    _spec("bloom-176b", 70, 14336, 112, 112, 4 * 14336, 250880, gated_mlp=False, tied_embeddings=True),
    _spec("smollm2-135m", 30, 576, 9, 3, 1536, 49152, tied_embeddings=True, context_len=8192),
    # the engine's random benchmark model (kvplan/engine/models.py)
    _spec("llama-100m", 12, 768, 12, 4, 2048, 32000, tied_embeddings=True, context_len=2048),
    # the engine's tiny random models (kvplan/engine/models.py), so that `serve tiny-llama` + `replay --endpoint
    # --model tiny-llama` and `simulate --model tiny-llama` find the model where `serve` does
    _spec("tiny-llama", 2, 64, 4, 2, 128, 512, context_len=512),
    _spec("tiny-qwen2", 2, 64, 4, 2, 128, 512, context_len=512),
    _spec("tiny-gpt2", 2, 64, 4, 4, 256, 512, gated_mlp=False, tied_embeddings=True, context_len=512),
    # meta-llama/Llama-3.2-1B config.json (16 layers, GQA 32/8 heads of 64, tied embeddings, rope-scaled to 131072
    # positions): the Llama 3 tokenizer's vocabulary, so a draft model for Llama-3/3.1 targets
    _spec("llama-3.2-1b", 16, 2048, 32, 8, 8192, 128256, head_dim=64, tied_embeddings=True, context_len=131072),
    # Llama 3.1 (meta-llama/Llama-3.1-{8B,70B,405B} config.json: rope-scaled to 131072 positions)
    _spec("llama-3.1-8b", 32, 4096, 32, 8, 14336, 128256, context_len=131072),
    _spec("llama-3.1-70b", 80, 8192, 64, 8, 28672, 128256, context_len=131072),
    _spec("llama-3.1-405b", 126, 16384, 128, 8, 53248, 128256, context_len=131072),
    # Qwen/Qwen2.5-72B-Instruct config.json (use_sliding_window: false, so every layer is full attention)
    _spec("qwen2.5-72b", 80, 8192, 64, 8, 29568, 152064, context_len=32768),
    # Qwen/Qwen3-{8B,32B} config.json: head_dim 128 stated (32B: not hidden / heads = 80)
    _spec("qwen3-8b", 36, 4096, 32, 8, 12288, 151936, head_dim=128, context_len=40960),
    _spec("qwen3-32b", 64, 5120, 64, 8, 25600, 151936, head_dim=128, context_len=40960),
    # Qwen/Qwen3-30B-A3B and Qwen3-235B-A22B config.json: every layer MoE (decoder_sparse_step 1, no
    # mlp_only_layers), 128 experts of moe_intermediate_size, 8 per token, no shared expert
    _spec("qwen3-30b-a3b", 48, 2048, 32, 4, 6144, 151936, head_dim=128, context_len=40960, num_experts=128,
          experts_per_token=8, moe_intermediate_size=768),
    _spec("qwen3-235b-a22b", 94, 4096, 64, 4, 12288, 151936, head_dim=128, context_len=40960, num_experts=128,
          experts_per_token=8, moe_intermediate_size=1536),
    # mistralai/Mixtral-8x7B-v0.1 config.json: 8 experts (num_local_experts) of intermediate_size, 2 per token
    _spec("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, context_len=32768, num_experts=8, experts_per_token=2,
          moe_intermediate_size=14336),
    # deepseek-ai/DeepSeek-V2-Lite and DeepSeek-V3 config.json: MLA (kv_lora_rank 512, qk_rope_head_dim 64,
    # qk_nope_head_dim 128, v_head_dim 128; V3 q_lora_rank 1536, Lite none), MoE after first_k_dense_replace dense
    # layers; V3's checkpoint is fp8 (quantization_config fp8, 128x128 blocks; its fp32 block scales, 1/4096 of a
    # byte per weight, are left out) with bf16 embeddings, head and KV cache
    _spec("deepseek-v2-lite", 27, 2048, 16, 16, 10944, 102400, head_dim=192, context_len=163840, num_experts=64,
          experts_per_token=6, shared_experts=2, moe_intermediate_size=1408, dense_layers=1, kv_lora_rank=512,
          qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128),
    _spec("deepseek-v3", 61, 7168, 128, 128, 18432, 129280, head_dim=192, context_len=163840, num_experts=256,
          experts_per_token=8, shared_experts=1, moe_intermediate_size=2048, dense_layers=3, kv_lora_rank=512,
          q_lora_rank=1536, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, quantization="fp8"),
    # google/gemma-3-27b-it config.json text_config (the SigLIP vision tower, ~0.4B, is left out): 5 sliding
    # layers of 1024 tokens to 1 full (sliding_window_pattern 6), tied embeddings, gated GELU MLP
    _spec("gemma-3-27b", 62, 5376, 32, 16, 21504, 262208, head_dim=128, tied_embeddings=True, context_len=131072,
          layer_types=tuple("full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(62)),
          sliding_window=1024),
    # openai/gpt-oss-{20b,120b} config.json: sliding (128 tokens) and full layers alternate, experts of
    # intermediate_size, 4 per token, MXFP4 experts (4-bit values + an 8-bit scale per 32: 0.53125 bytes),
    # attention, router, embeddings and head bf16. Its per-head attention sinks are learned logits: no KV bytes.
    _spec("gpt-oss-20b", 24, 2880, 64, 8, 2880, 201088, head_dim=64, context_len=131072, num_experts=32,
          experts_per_token=4, moe_intermediate_size=2880, quantization="mxfp4",
          layer_types=("sliding_attention", "full_attention") * 12, sliding_window=128),
    _spec("gpt-oss-120b", 36, 2880, 64, 8, 2880, 201088, head_dim=64, context_len=131072, num_experts=128,
          experts_per_token=4, moe_intermediate_size=2880, quantization="mxfp4",
          layer_types=("sliding_attention", "full_attention") * 18, sliding_window=128),
)}

# the kv_cache_dtype setting (vLLM's names) -> the simulator's KV dtype (None: the model's own)
_KV_CACHE_DTYPES = {"auto": None, "fp8": "float8", "fp8_e4m3": "float8"}


def sim_kv_dtype(kv_cache_dtype: str) -> str | None:
    return _KV_CACHE_DTYPES.get(kv_cache_dtype, kv_cache_dtype)
# kvplan's engine keeps one float32 scale per token per KV head beside a quantized row (kvplan/kernels/quant.py); vLLM's
# GPU fp8 cache uses per-tensor scales, so the analytic (GPU) model counts the 1-byte values alone
ENGINE_SCALE_BYTES = 4
QUANTIZED_KV = ("float8", "int8")


def engine_kv_row_bytes(dtype: str, head_dim: int) -> int:
    """Bytes of one token's K (or V) row of one KV head in kvplan's engine cache."""
    return DTYPE_BYTES[dtype] * head_dim + (ENGINE_SCALE_BYTES if dtype in QUANTIZED_KV else 0)


def allowed_models(examples: bool = True) -> str:
    """What --model allows, short enough for one error line: how many built-in names there are and where they are
    all listed, with a few of them unless a did-you-mean (`unknown_model`) already names the close ones."""
    shown = "llama-3.1-8b, qwen3-30b-a3b, deepseek-v3, ... " if examples else ""
    return (f"a built-in model ({shown}{len(MODELS)} in all: `kvplan simulate --help` lists them), or a path to an "
            "HF config.json")


def unknown_model(name: str) -> str:
    """The line for a name that is neither a built-in model nor a file: a did-you-mean over every built-in name."""
    hint = did_you_mean(name, MODELS)
    return f"unknown model {short_repr(name)}; {hint}allowed: {allowed_models(not hint)}"


def get_model(name: str) -> ModelSpec:
    """A built-in spec by name, or the spec read from a path to an HF config.json (or its directory)."""
    if name in MODELS:
        return MODELS[name]
    path = Path(name)
    try:
        path.stat()
    except OSError as exc:  # a 5,000-character name: ENAMETOOLONG, which is_dir() raises instead of answering
        if exc.errno == errno.ENAMETOOLONG:
            raise UserError(f"--model: {unknown_model(name)}") from None
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UserError(f"--model: {path}: a directory without config.json; allowed: a model directory "
                             "or a path to an HF config.json")
        path = path / "config.json"
    if path.suffix == ".json":
        if not path.exists():  # a ValueError like an unknown name: a calibrated run may name the model as a label
            hint = did_you_mean(path.stem, MODELS)
            raise UserError(f"--model: {path}: no such file; {hint}allowed: {allowed_models(not hint)}")
        return from_hf_config(path)
    raise UserError(f"--model: {unknown_model(name)}")


