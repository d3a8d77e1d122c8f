"""reference/models.md and reference/hardware.md: the built-in model specs (`sim.specs.models.MODELS`) and GPUs
(`sim.specs.hardware.HARDWARE`), every figure read from the spec the simulator prices with."""

from __future__ import annotations

import inspect
from collections.abc import Mapping

from kvplan.reference.cells import code, prose, size, table
from kvplan.sim.specs import hardware as hw
from kvplan.sim.specs.arch import DTYPE_BYTES, ModelSpec
from kvplan.sim.specs.hardware import HardwareSpec
from kvplan.sim.specs.models import MODELS

BF16 = DTYPE_BYTES["bfloat16"]


def attention_kind(m: ModelSpec) -> str:
    """MLA, MHA (a KV head per query head) or GQA, with the sliding-window layers of a hybrid model."""
    kind = "MLA" if m.is_mla else "MHA" if m.num_kv_heads == m.num_heads else "GQA"
    sliding = sum(1 for t in m.layer_types or () if t == "sliding_attention")
    if sliding:
        kind += f", {sliding} of {m.num_layers} layers sliding ({m.sliding_window:,}-token window)"
    return kind


def mlp_kind(m: ModelSpec) -> str:
    if not m.is_moe:
        return "dense"
    shared = f" + {m.shared_experts} shared" if m.shared_experts else ""
    return f"MoE, {m.experts_per_token} of {m.num_experts} experts{shared}"


def shape(m: ModelSpec) -> str:
    """'32 layers x 4,096; 32 heads, 8 KV, dim 128'."""
    return f"{m.num_layers} x {m.hidden_size:,}; {m.num_heads} heads, {m.num_kv_heads} KV, dim {m.head_dim}"


def params(n: float) -> str:
    return f"{n / 1e9:.3g} B" if n >= 1e9 else f"{n / 1e6:.3g} M"


def kib(n: float) -> str:
    if n < 1024:
        return f"{n:g} B"
    return f"{n / 1024:,.1f} KiB" if n % 1024 else f"{int(n) // 1024:,} KiB"


def models_page(models: Mapping[str, ModelSpec] | None = None) -> str:
    models = MODELS if models is None else models
    rows = [[code(m.name), shape(m), params(m.num_params) + (f" ({params(m.active_layer_params + m.lm_head_params)}"
                                                              " active)" if m.is_moe else ""),
             kib(m.kv_bytes_per_token(BF16)), f"{m.context_len:,}" if m.context_len else "",
             f"{attention_kind(m)}; {mlp_kind(m)}"] for m in models.values()]
    lines = ["# Models", "",
             f"The {len(models)} built-in model specs (`kvplan/sim/specs/models.py`), generated from the specs the "
             "simulator prices with when the docs are built. Each follows the model's published HF "
             "`config.json`; any other decoder-only model is read from a path to its `config.json` "
             "(`--model path/to/config.json`, or `model:` in an experiment file).", "",
             "- **shape**: layers x hidden size; attention heads, KV heads and the head dimension.",
             "- **params**: every weight (all experts of an MoE model; embeddings, and the LM head unless tied); "
             "*active*: what one token multiplies through in an MoE model (attention, router, shared and "
             "routed experts per token, and the LM head).",
             "- **KV / token**: K and V of one token in every layer at bf16 (2 bytes) on one GPU, "
             "2 x layers x KV heads x head dim x 2 bytes; MLA stores its compressed latent and shared RoPE key "
             "instead, (kv_lora_rank + qk_rope_head_dim) x layers x 2 bytes. A sliding layer holds at most "
             "its window of tokens, so a hybrid model's long contexts need less than this per token.",
             "- **context**: the published `max_position_embeddings`, vLLM's default and upper bound for "
             "`max_model_len`.",
             "- **architecture**: the attention (MHA, GQA, MLA; a hybrid's sliding-window layers) and the MLP "
             "(dense, or the routed experts a token goes through of all there are).", "",
             *table(["model", "shape", "params", "KV / token", "context", "architecture"], rows)]
    return "\n".join(lines).rstrip("\n") + "\n"


def rate(bytes_per_s: float) -> str:
    return f"{bytes_per_s / 1e12:g} TB/s" if bytes_per_s >= 1e12 else f"{bytes_per_s / 1e9:g} GB/s"


def node_text(g: HardwareSpec) -> str:
    """'8 GPUs on nvlink, 450 GB/s each, NVLS' or '1 GPU'."""
    gpus = f"{g.gpus_per_node} GPU{'s' if g.gpus_per_node > 1 else ''}"
    if not g.link_bandwidth:
        return gpus
    return f"{gpus} on {g.interconnect}, {rate(g.link_bandwidth)} each" + (", NVLS" if g.nvls else "")


def hardware_page(gpus: Mapping[str, HardwareSpec] | None = None) -> str:
    gpus = hw.HARDWARE if gpus is None else gpus
    device = [[code(g.name), size(g.memory_bytes), rate(g.hbm_bandwidth), f"{g.peak_flops / 1e12:g}",
               f"{g.sm_count} at {g.clock_hz / 1e6:g} MHz, {g.threads_per_sm} threads each" if g.sm_count else ""]
              for g in gpus.values()]
    node = [[code(g.name), node_text(g), rate(g.internode_bandwidth) if g.internode_bandwidth else "",
             rate(g.host_link_bandwidth), rate(g.disk_bandwidth)] for g in gpus.values()]
    sources = (inspect.getdoc(hw) or "").partition("\n\n")[2]  # after the module's one-line summary
    lines = ["# Hardware", "",
             f"The {len(gpus)} built-in GPUs (`kvplan/sim/specs/hardware.py`) the analytic cost model prices "
             "steps on, generated from the specs when the docs are built. `--hardware` (and `hardware:` in an "
             "experiment file) also takes `cpu-local`, this machine's CPU through a shipped calibrated profile, "
             "or a calibrated profile written by `kvplan calibrate`.", "",
             "## The device", "",
             "Dense BF16/FP16 tensor throughput, memory and its bandwidth, and the streaming multiprocessors "
             "(GEMM wave quantization) with their boost clock and resident threads (the element-wise kernels' "
             "floors).", "",
             *table(["GPU", "memory", "bandwidth", "BF16 TFLOP/s", "SMs"], device), "",
             "## The node", "",
             "What tensor and pipeline parallelism and the KV tiers cost: the GPUs of a node and the link between "
             "them (bandwidth per GPU, one direction; NVLS: the switch reduces in the network, NVLink SHARP), "
             "the network between nodes per GPU, the host link (swap and the CPU tier) and a local NVMe (the "
             "disk tier).", "",
             *table(["GPU", "node", "between nodes", "host link", "disk"], node), "",
             "## Where the figures come from", "", prose(sources)]
    return "\n".join(lines).rstrip("\n") + "\n"
