"""LoRA in the simulator (sim.lora): adapter sizes against PEFT's published parameter counts, the memory vLLM
reserves, and how the step and load prices scale."""

from __future__ import annotations

import pytest

from kvplan.errors import UserError
from kvplan.sim.lora import LoraShapes, adapter_bytes, calibrated_lora_cost, gpu_lora_cost, reserved_bytes
from kvplan.sim.specs.hardware import get_hardware
from kvplan.sim.specs.models import get_model


def test_a_rank_16_adapter_on_every_linear_layer_of_llama_3_8b_has_pefts_parameter_count():
    # PEFT prints "trainable params: 41,943,040" for LoraConfig(r=16, target_modules="all-linear") on Llama-3-8B
    model = get_model("llama-3-8b")
    assert LoraShapes.of(model).adapter_elements(16, model.num_layers) == 41_943_040
    assert adapter_bytes(model, 16) == 2 * 41_943_040


def test_the_reserved_buffers_are_max_loras_slots_of_max_rank_sharded_by_tp():
    model = get_model("llama-3-8b")
    one = reserved_bytes(model, 1, 16)
    assert reserved_bytes(model, 4, 16) == 4 * one
    assert reserved_bytes(model, 1, 64) == 4 * one
    # TP shards B of the column-parallel layers and A of the row-parallel ones; the rest is whole on every rank
    assert one / 2 < reserved_bytes(model, 1, 16, tp=2) < one


def test_step_and_load_prices_scale_as_their_work():
    model, hw = get_model("llama-3-8b"), get_hardware("h100-sxm")
    cost = gpu_lora_cost(model, hw, 16, 1, model.num_layers, 0.0, 0.7, 0.8)
    assert cost.step_seconds(0, 0) == 0.0
    decode = cost.step_seconds(8, 1)
    assert cost.step_seconds(8, 4) > decode  # four adapters' weights read instead of one
    assert cost.step_seconds(8192, 1) > cost.step_seconds(64, 1)
    assert cost.load_seconds([16], []) == pytest.approx(adapter_bytes(model, 16) / hw.host_link_bandwidth)
    assert cost.load_seconds([], [16]) > cost.load_seconds([16], [])


def test_a_calibrated_cpu_prices_a_lora_flop_as_a_layer_flop():
    model = get_model("smollm2-135m")
    cost = calibrated_lora_cost(model, 8, 1e-4, 1e9, 1e9)
    flops = 2 * 10 * 8 * LoraShapes.of(model).adapter_elements(1, model.num_layers)
    assert cost.step_seconds(10, 2) == pytest.approx(flops * 1e-4 / (2 * model.layer_matmul_params))


def test_moe_and_mla_models_are_refused_in_one_line():
    with pytest.raises(UserError, match="allowed: a dense model"):
        LoraShapes.of(get_model("mixtral-8x7b"))
