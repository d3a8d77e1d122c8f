"""Cost models, specs and KV capacity arithmetic."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engine.core import CacheConfig, Scheduler, SchedulerConfig, make_request
from sim.cost.analytic import AnalyticCost, kv_capacity_blocks
from sim.cost.calibrated import load_profile
from sim.cost.features import FEATURE_NAMES, decode_stretch_features, step_features
from sim.run import SimSpec, build_cost
from sim.specs.hardware import HardwareSpec, get_hardware
from sim.specs.models import MODELS, get_model


def test_llama2_7b_kv_bytes_and_the_24gb_card_seed_arithmetic():
    llama = get_model("llama-2-7b")
    assert llama.kv_bytes_per_token() == 524_288  # 2 x 32 layers x 32 heads x 128 dims x 2 bytes
    assert 13.3e9 < llama.weight_bytes < 14e9
    card = HardwareSpec("card-24gb", 1e14, 1e12, 24e9, 25e9)
    tokens = kv_capacity_blocks(llama, card, 16, gpu_memory_utilization=1.0, max_num_batched_tokens=0,
                                max_num_seqs=0) * 16
    assert 19_500 < tokens < 20_500  # (24 GB - ~13.5 GB of weights) / 512 KiB ~ 20k tokens
    with_reserve = kv_capacity_blocks(llama, get_hardware("rtx-4090"), 16) * 16
    assert 15_000 < with_reserve < 22_000


def test_kv_dtype_halves_bytes_and_doubles_capacity():
    model, hw = get_model("llama-3-8b"), get_hardware("h100-sxm")
    assert model.kv_bytes_per_token(1) == model.kv_bytes_per_token() / 2
    fp16 = kv_capacity_blocks(model, hw, 16)
    assert kv_capacity_blocks(model, hw, 16, kv_dtype_bytes=1) in (2 * fp16, 2 * fp16 + 1)


def test_builtin_specs_and_hf_config(tmp_path):
    assert set(MODELS) >= {"llama-2-7b", "llama-2-13b", "llama-3-8b", "llama-3-70b", "qwen2.5-7b", "mistral-7b",
                           "opt-13b", "smollm2-135m"}
    assert 7.9e9 < get_model("llama-3-8b").num_params < 8.1e9
    cfg = {"hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3, "num_hidden_layers": 30,
           "intermediate_size": 1536, "vocab_size": 49152, "tie_word_embeddings": True}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    spec = get_model(str(tmp_path))
    assert spec.num_params == get_model("smollm2-135m").num_params
    with pytest.raises(ValueError, match=r"allowed: .*llama-2-7b"):
        get_model("gpt-5")
    with pytest.raises(ValueError, match="allowed: a100-40gb, a100-80gb, a10g, h100-sxm, h200, l4, l40s, rtx-4090"):
        get_hardware("tpu")


def test_analytic_decode_step_is_the_roofline_by_hand():
    model, hw = get_model("llama-2-7b"), get_hardware("a100-80gb")
    cost = AnalyticCost(model, hw, 16, compute_efficiency=0.5, memory_efficiency=0.5, step_overhead_s=1e-3,
                        request_overhead_s=1e-4)
    f = decode_stretch_features(np.array([100, 200]), np.array([5, 5]), 1, 16)  # decodes attending 100 and 200
    blocks = 7 + 13
    traffic = model.weight_bytes + blocks * 16 * 524_288 + 2 * 524_288
    flops = 2 * model.matmul_params * 2 + 4 * 32 * 32 * 128 * 300
    expected = max(traffic / (hw.hbm_bandwidth * 0.5), flops / (hw.peak_flops * 0.5)) + 1e-3 + 2e-4
    assert cost.step_times(f)[0] == pytest.approx(expected, rel=1e-12)
    assert cost.transfer_time(4, 0) == pytest.approx(4 * 16 * 524_288 / hw.host_link_bandwidth)


def _profile(tmp_path, text: str):
    path = tmp_path / "p.yaml"
    path.write_text(text)
    return path


def test_calibrated_profile_is_a_linear_model_over_the_features(tmp_path):
    path = _profile(tmp_path, "block_size: 16\nkv_capacity_blocks: 500\nswap_seconds_per_block: 0.5\n"
                              "coefficients: {step: 1.0, request: 0.1, prefill_tokens: 0.01, prefill_attention: 0.001,"
                              " decode_requests: 2.0, decode_context: 0.0001, decode_context_max: 0.003,"
                              " blocks_touched: 0.2}\n")
    cost = load_profile(path)
    cache = CacheConfig(block_size=16, num_blocks=64, enable_prefix_caching=False, max_model_len=256)
    sched = Scheduler(cache, SchedulerConfig())
    sched.add_request(make_request("a", prompt_len=40, max_tokens=3))
    sched.update(sched.schedule())
    sched.add_request(make_request("b", prompt_len=20, max_tokens=3))
    step = sched.schedule()  # a decodes at position 40 (attends 41), b prefills 20 tokens from 0
    f = step_features(step.scheduled, 16)
    expected = 1.0 + 0.1 * 2 + 0.01 * 20 + 0.001 * (20 * 10) + 2.0 + 0.0001 * 41 + 0.003 * 41 + 0.2 * (3 + 2)
    assert cost.step_times(f) == pytest.approx(expected)
    assert cost.transfer_time(3, 0) == 1.5
    _, blocks = build_cost(SimSpec(cost="calibrated", profile=str(path), block_size=32))
    assert blocks == 250  # measured at block 16: the same bytes in blocks of 32


@pytest.mark.parametrize("text,match", [
    ("coefficients: {warp: 1}", "coefficients.warp: unknown feature; allowed: step"),
    ("coefficients: {step: fast}", "coefficients.step: must be a number"),
    ("speed: 1\ncoefficients: {step: 1}", "unknown key 'speed'"),
    ("kv_capacity_blocks: -3\ncoefficients: {step: 1}", "kv_capacity_blocks: must be an integer >= 1"),
])
def test_bad_profiles_name_the_key(tmp_path, text, match):
    with pytest.raises(ValueError, match=match):
        load_profile(_profile(tmp_path, text))


def test_stretch_features_match_single_steps_of_the_core():
    cache = CacheConfig(block_size=4, num_blocks=200, enable_prefix_caching=False, max_model_len=128)
    sched = Scheduler(cache, SchedulerConfig())
    for i, (prompt, max_tokens) in enumerate(((5, 50), (9, 4), (30, 9))):  # two finish inside the stretch
        sched.add_request(make_request(str(i), prompt_len=prompt, max_tokens=max_tokens))
    sched.update(sched.schedule())
    contexts = np.array([r.num_computed_tokens + 1 for r in sched.running])
    remaining = np.array([r.max_tokens - r.num_output_tokens for r in sched.running])
    stretch = decode_stretch_features(contexts, remaining, 12, 4)
    assert stretch.num_requests.tolist() == [3, 3, 3, 2, 2, 2, 2, 2, 1, 1, 1, 1]
    for j in range(12):
        out = sched.schedule()
        step = step_features(out.scheduled, 4)
        for name in FEATURE_NAMES:
            assert getattr(step, name) == np.broadcast_to(getattr(stretch, name), 12)[j], (name, j)
        sched.update(out)
