"""`ModelSpec`: the shapes of a decoder-only model that decide its weight bytes, FLOPs and KV bytes per token.

Dense (Llama, Qwen, Mistral, OPT), mixture-of-experts (Mixtral, Qwen3-MoE, DeepSeek, gpt-oss) and multi-head
latent attention (MLA: DeepSeek-V2/V3) models are one record; a field left at its default (0, None) means the
plain dense case, so a dense spec's numbers are exactly the ones it always had. Invariants:
- the weights hold every expert (`weight_bytes`), a token multiplies through the active ones only
  (`active_layer_params`: attention, router, shared experts and `experts_per_token` routed experts per MoE layer);
- KV bytes per token: 2 × layers × KV heads × head_dim × bytes (K and V), or with MLA the compressed latent and
  the shared RoPE key, (kv_lora_rank + qk_rope_head_dim) × layers × bytes; per tensor-parallel rank the KV heads
  split across ranks (a head replicated when there are fewer heads than ranks, as vLLM does) and MLA's latent is
  held whole by every rank; per pipeline stage only its layers.
"""

from __future__ import annotations

from dataclasses import dataclass

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8": 1, "int8": 1}


def stage_layers(num_layers: int, pp: int) -> int:
    """Layers of the largest pipeline stage (vLLM splits the layers evenly, the remainder on some stages)."""
    return -(-num_layers // pp)


@dataclass(slots=True, frozen=True)
class ModelSpec:
    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int  # the dense MLP's (MoE models: the leading dense layers', if any)
    vocab_size: int
    dtype_bytes: int = 2  # activations, the embedding table and the LM head (and, by default, every weight)
    gated_mlp: bool = True  # SwiGLU (three MLP matrices) vs a plain two-matrix MLP (OPT)
    tied_embeddings: bool = False
    # The context length (HF `max_position_embeddings`): vLLM's default and upper bound for max_model_len.
    # None: not stated (a config.json without it), so only the workload bounds it.
    context_len: int | None = None
    # Per-layer attention kind, HF's `layer_types` spelling ("full_attention" or "sliding_attention"); None: every
    # layer attends to the whole context. Sliding layers attend to the last `sliding_window` tokens only.
    layer_types: tuple[str, ...] | None = None
    sliding_window: int | None = None
    # --- mixture of experts (0 experts: a dense model) ---
    num_experts: int = 0  # routed experts per MoE layer (HF num_local_experts / num_experts / n_routed_experts)
    experts_per_token: int = 0  # routed experts each token goes through (num_experts_per_tok)
    shared_experts: int = 0  # experts every token goes through (DeepSeek n_shared_experts), moe_intermediate wide
    moe_intermediate_size: int = 0  # one expert's MLP width
    dense_layers: int = 0  # leading layers with a dense MLP instead (DeepSeek first_k_dense_replace)
    # Bytes per parameter of the layers' weights (DeepSeek-V3's fp8 checkpoint: 1) and of the routed experts
    # (gpt-oss MXFP4: 4 bits + one 8-bit scale per 32 = 0.53125); None: as the layers' weights / `dtype_bytes`.
    weight_dtype_bytes: float | None = None
    expert_dtype_bytes: float | None = None
    # The weight quantization method that set those widths (`sim.specs.quantization`: fp8, awq, gptq, mxfp4; the
    # checkpoint's quantization_config or the `quantization` setting); None: the model dtype's weights.
    quantization: str | None = None
    # --- multi-head latent attention (0: standard multi-head / grouped-query attention) ---
    kv_lora_rank: int = 0
    q_lora_rank: int = 0  # 0: q is a full hidden x heads x qk_head_dim projection (DeepSeek-V2-Lite)
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0

    # --- the shape ---
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.dense_layers if self.is_moe else 0

    @property
    def attention_params(self) -> int:
        """One layer's attention projections: q, k, v, o (MLA: q (through q_lora_rank when given), the joint
        kv_a down-projection to the latent and the RoPE key, kv_b up to per-head keys and values, o)."""
        h = self.hidden_size
        if not self.is_mla:
            return h * self.head_dim * (2 * self.num_heads + 2 * self.num_kv_heads)
        qk = self.qk_nope_head_dim + self.qk_rope_head_dim
        q = (h * self.q_lora_rank + self.q_lora_rank * self.num_heads * qk) if self.q_lora_rank else \
            h * self.num_heads * qk
        kv_a = h * (self.kv_lora_rank + self.qk_rope_head_dim)
        kv_b = self.kv_lora_rank * self.num_heads * (self.qk_nope_head_dim + self.v_head_dim)
        return q + kv_a + kv_b + self.num_heads * self.v_head_dim * h

    @property
    def layer_params(self) -> int:
        """A dense layer's GEMM parameters: attention plus the MLP."""
        return self.attention_params + (3 if self.gated_mlp else 2) * self.hidden_size * self.intermediate_size

    @property
    def expert_params(self) -> int:
        """One expert (gate, up, down)."""
        return 3 * self.hidden_size * self.moe_intermediate_size

    @property
    def moe_fixed_params(self) -> int:
        """The parameters of one MoE layer every token multiplies through: attention, router, shared experts."""
        return self.attention_params + self.hidden_size * self.num_experts + self.shared_experts * self.expert_params

    @property
    def routed_expert_params(self) -> int:
        """Every routed expert of every MoE layer (resident; each token uses experts_per_token of them)."""
        return self.num_moe_layers * self.num_experts * self.expert_params

    @property
    def dense_part_params(self) -> int:
        """Layer GEMM parameters outside the routed experts (the dense layers, and attention, router and shared
        experts of the MoE layers): every step reads them whole."""
        return (self.num_layers - self.num_moe_layers) * self.layer_params + self.num_moe_layers * \
            self.moe_fixed_params

    @property
    def layer_matmul_params(self) -> int:
        """Parameters of every layer's GEMMs (q, k, v, o, the MLP, every expert)."""
        return self.dense_part_params + self.routed_expert_params

    @property
    def active_layer_params(self) -> int:
        """Layer GEMM parameters one token multiplies through (2 FLOPs each): a dense model's are all of them."""
        routed = self.num_moe_layers * self.experts_per_token * self.expert_params
        return self.dense_part_params + routed

    @property
    def lm_head_params(self) -> int:
        """The LM head (vocab × hidden; the embedding table itself when tied): only sampled rows multiply through it."""
        return self.vocab_size * self.hidden_size

    @property
    def matmul_params(self) -> int:
        """Parameters a sampled token multiplies through (all layers plus the LM head; not the embedding lookup)."""
        return self.layer_matmul_params + self.lm_head_params

    @property
    def num_params(self) -> int:
        embed = self.vocab_size * self.hidden_size
        return self.layer_matmul_params + embed * (1 if self.tied_embeddings else 2)

    # --- bytes ---
    @property
    def layer_weight_bytes(self) -> float:
        """Resident bytes of the dense part of the layers (see `dense_part_params`)."""
        width = self.dtype_bytes if self.weight_dtype_bytes is None else self.weight_dtype_bytes
        return self.dense_part_params * width

    @property
    def expert_weight_bytes(self) -> float:
        width = self.expert_dtype_bytes if self.expert_dtype_bytes is not None else (
            self.dtype_bytes if self.weight_dtype_bytes is None else self.weight_dtype_bytes)
        return self.routed_expert_params * width

    @property
    def embedding_bytes(self) -> int:
        """The input embedding table and the LM head (one table when tied)."""
        return self.vocab_size * self.hidden_size * (1 if self.tied_embeddings else 2) * self.dtype_bytes

    @property
    def weight_bytes(self) -> float:
        if self.weight_dtype_bytes is None and self.expert_dtype_bytes is None:
            return self.num_params * self.dtype_bytes  # one width for everything: the exact integer
        return self.layer_weight_bytes + self.expert_weight_bytes + self.embedding_bytes

    def kv_heads_per_rank(self, tp: int = 1) -> int:
        """KV heads each tensor-parallel rank holds: split across ranks, at least one (replicated)."""
        return max(self.num_kv_heads // tp, 1)

    def kv_bytes_per_token(self, kv_dtype_bytes: float | None = None, tp: int = 1, pp: int = 1) -> float:
        """K and V of one token in every layer of one rank (e.g. Llama-2-7B fp16: 2*32*32*128*2 = 524,288 bytes;
        MLA: (kv_lora_rank + qk_rope_head_dim) per layer, whole on every rank)."""
        width = self.dtype_bytes if kv_dtype_bytes is None else kv_dtype_bytes
        layers = stage_layers(self.num_layers, pp)
        if self.is_mla:
            return layers * (self.kv_lora_rank + self.qk_rope_head_dim) * width
        return 2 * layers * self.kv_heads_per_rank(tp) * self.head_dim * width

    # --- attention FLOPs ---
    @property
    def prefill_pair_flops(self) -> int:
        """FLOPs per (query, key) pair in prefill, all layers: QK^T and PV per head (MLA, unabsorbed: per-head keys
        of qk_nope + qk_rope dims and values of v_head_dim)."""
        if self.is_mla:
            return 2 * self.num_layers * self.num_heads * (self.qk_nope_head_dim + self.qk_rope_head_dim +
                                                           self.v_head_dim)
        return 4 * self.num_layers * self.num_heads * self.head_dim

    @property
    def decode_pair_flops(self) -> int:
        """FLOPs per (query, key) pair in decode. MLA decodes in the latent space (vLLM's weight absorption: q is
        mapped into the latent, scores over kv_lora_rank + qk_rope dims, values are the kv_lora_rank latent)."""
        if self.is_mla:
            return 2 * self.num_layers * self.num_heads * (2 * self.kv_lora_rank + self.qk_rope_head_dim)
        return self.prefill_pair_flops
