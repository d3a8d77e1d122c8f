"""Weight quantization (`--quantization`, sim.specs.quantization): fewer weight bytes leave more KV blocks, fp8
GEMMs run at the FP8 tensor-core rate, int4 weight-only GEMMs move about a quarter of the bytes, `none` prices
exactly as before, and every quantization a model, GPU or cost model cannot use is refused in one line."""

from __future__ import annotations

import pytest

from kvplan.cli import main
from kvplan.sim.cost.parallel import Shape, weight_bytes_per_rank
from kvplan.sim.run import build_cost, simulate
from kvplan.sim.spec import SimSpec
from kvplan.sim.specs.hardware import HARDWARE
from kvplan.sim.specs.models import get_model
from kvplan.sim.specs.quantization import METHODS, gemm_peak, quantized
from kvplan.traces import Trace

TRACE = "traces/samples/chat.jsonl"


def _cost(quantization: str, model: str = "llama-3-70b", hardware: str = "h100-sxm", tp: int = 4):
    return build_cost(SimSpec(model=model, hardware=hardware, tensor_parallel_size=tp, block_size=16,
                              quantization=quantization))


@pytest.mark.parametrize(("model", "hardware", "tp"), [("llama-3-70b", "h100-sxm", 4), ("llama-3-8b", "l40s", 1)])
def test_fp8_and_int4_weights_leave_more_kv_blocks(model, hardware, tp):
    blocks = {q: _cost(q, model, hardware, tp)[1] for q in ("none", "fp8", "awq")}
    assert blocks["none"] < blocks["fp8"] < blocks["awq"]
    # the layers' linear weights shrink, the embedding table and the LM head stay bf16
    m, hw = get_model(model), HARDWARE[hardware]
    fp8 = quantized(m, "fp8", hw)
    tables = 2 * m.vocab_size * m.hidden_size * 2
    assert weight_bytes_per_rank(fp8, Shape(tp)) == pytest.approx((m.layer_matmul_params * 1 + tables) / tp)
    assert weight_bytes_per_rank(m, Shape(tp)) == pytest.approx((m.layer_matmul_params * 2 + tables) / tp)


def test_gemms_run_at_the_fp8_rate_and_int4_moves_about_a_quarter_of_the_bytes():
    bf16, fp8, awq = (_cost(q)[0] for q in ("none", "fp8", "awq"))
    floor = bf16.resolved_laws.gemm_floor_s
    k, n = 8192, 28672 * 2 // 4  # llama-3-70b's up+gate projection on one of 4 ranks

    def gemm(cost, rows: int) -> float:
        return cost._gemm(rows, k, n) - floor

    hw = HARDWARE["h100-sxm"]
    # compute bound (a long prefill chunk): the FP8 rate over the BF16 rate, the same fitted efficiency
    assert gemm(bf16, 8192) / gemm(fp8, 8192) == pytest.approx(hw.fp8_flops / hw.peak_flops, rel=1e-12)
    assert 1.99 < hw.fp8_flops / hw.peak_flops < 2.01
    # memory bound (one decode row): the weight bytes dominate, 1 byte instead of 2, ~0.26 for int4 + scales
    assert gemm(fp8, 1) / gemm(bf16, 1) == pytest.approx(0.5, rel=2e-3)
    assert gemm(awq, 1) / gemm(bf16, 1) == pytest.approx(METHODS["awq"].weight_bytes / 2, rel=2e-3)
    assert 0.25 < gemm(awq, 1) / gemm(bf16, 1) < 0.28
    # int4 weight-only: dequantized to bf16, so a compute-bound GEMM runs at the BF16 rate
    assert gemm(awq, 8192) == pytest.approx(gemm(bf16, 8192), rel=1e-12)
    # the LM head stays in the model dtype at the BF16 rate
    assert fp8._head_time(64) == bf16._head_time(64) == awq._head_time(64)


def test_none_prices_exactly_as_before():
    m, hw = get_model("llama-3-8b"), HARDWARE["h100-sxm"]
    assert quantized(m, "none", hw) is m and gemm_peak(m, hw) == hw.peak_flops
    trace = Trace.build([0.0, 0.2, 0.4], [300, 900, 50], [20, 8, 40])
    plain = simulate(trace, SimSpec(model="llama-3-8b", hardware="h100-sxm", block_size=16)).summary
    none = simulate(trace, SimSpec(model="llama-3-8b", hardware="h100-sxm", block_size=16,
                                   quantization="none")).summary
    fp8 = simulate(trace, SimSpec(model="llama-3-8b", hardware="h100-sxm", block_size=16,
                                  quantization="fp8")).summary
    assert none == plain
    assert fp8["mean_tpot_ms"] < plain["mean_tpot_ms"]


def test_a_checkpoints_own_quantization_comes_from_the_one_table(tmp_path):
    import json

    base = {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32,
            "intermediate_size": 14336, "vocab_size": 128256, "torch_dtype": "float16"}
    for method, extra, width in (("awq", {"bits": 4, "group_size": 128, "zero_point": True}, 0.51953125),
                                 ("gptq", {"bits": 4, "group_size": 128, "sym": True}, 0.515625),
                                 ("fp8", {}, 1.0)):
        path = tmp_path / f"{method}.json"
        path.write_text(json.dumps({**base, "quantization_config": {"quant_method": method, **extra}}))
        m = get_model(str(path))
        assert (m.quantization, m.weight_dtype_bytes) == (method, width) == (method, METHODS[method].weight_bytes)
        # naming the checkpoint's own method is the checkpoint; none keeps it
        assert quantized(m, method, HARDWARE["h100-sxm"]) is m is quantized(m, "none", HARDWARE["h100-sxm"])
    assert gemm_peak(get_model("deepseek-v3"), HARDWARE["h200"]) == HARDWARE["h200"].fp8_flops
    # Ampere runs an fp8 checkpoint weight-only (vLLM's FP8 Marlin): 1-byte weights at the BF16 rate
    assert gemm_peak(get_model("deepseek-v3"), HARDWARE["a100-80gb"]) == HARDWARE["a100-80gb"].peak_flops


REFUSED = [
    (["simulate", "--trace", TRACE, "--hardware", "a100-80gb", "--quantization", "fp8"],
     "kvplan simulate: error: --quantization: fp8 needs FP8 tensor cores, which a100-80gb lacks; allowed on: "
     "h100-sxm, h200, b200, l4, l40s, rtx-pro-6000, rtx-4090; on a100-80gb: none, awq or gptq"),
    (["simulate", "--trace", TRACE, "--hardware", "cpu-local", "--model", "smollm2-135m", "--quantization", "awq"],
     "kvplan simulate: error: --quantization: awq: the calibrated cost model prices the measured engine with its "
     "own weights; allowed: none, or --cost analytic on a GPU --hardware"),
    (["simulate", "--trace", TRACE, "--cost", "recorded", "--profile", "steps.jsonl", "--quantization", "fp8"],
     "kvplan simulate: error: --quantization: fp8: the recorded cost model prices"),
    (["simulate", "--trace", TRACE, "--model", "gpt-oss-20b", "--hardware", "h200", "--quantization", "awq"],
     "kvplan simulate: error: --quantization: awq differs from the mxfp4 quantization of gpt-oss-20b's "
     "checkpoint; allowed: none (the checkpoint's own)"),
    (["simulate", "--trace", TRACE, "--model", "deepseek-v3", "--hardware", "h200", "--quantization", "gptq"],
     "allowed: none or fp8 (the checkpoint's own)"),
]


@pytest.mark.parametrize(("argv", "message"), REFUSED)
def test_a_quantization_that_cannot_run_is_one_line_exit_2(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err


def test_the_live_engine_refuses_a_quantization_it_does_not_run():
    """`kvplan serve --quantization fp8` and `LLM(quantization=...)`: one line, only none accepted (the engine
    commands' flags go through `options_from_args`, as `kvplan serve` parses them)."""
    import argparse

    from kvplan.engine.options import engine_options
    from kvplan.engine_args import add_engine_arguments, options_from_args
    from kvplan.errors import ConfigError

    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    assert options_from_args(parser.parse_args(["--quantization", "none"])).dtype == "bfloat16"
    with pytest.raises(ConfigError) as info:
        options_from_args(parser.parse_args(["--quantization", "fp8"]))
    assert str(info.value) == ("argument --quantization: 'fp8': weight quantization is simulator-only (kvplan "
                               "simulate --quantization prices it; the live engine runs the model's own weights in "
                               "--dtype); allowed on the live engine: 'none'")
    with pytest.raises(ConfigError, match=r"^quantization: 'awq': weight quantization is simulator-only"):
        engine_options({"quantization": "awq"})


def test_an_experiment_grid_over_quantization_refuses_the_fp8_point_on_ampere(tmp_path, capsys):
    path = tmp_path / "q.yaml"
    path.write_text("name: q\nmodel: llama-3-8b\nworkload: {trace: sample:chat, mode: burst}\n"
                    "sweep:\n  grid:\n    hardware: [h100-sxm, a100-80gb]\n    engine.quantization: [none, fp8]\n")
    assert main(["run", str(path), "--explain"]) == 2
    err = capsys.readouterr().err.strip()
    assert f"{path}: point 3 (hardware=a100-80gb quantization=fp8): engine.quantization: fp8 needs FP8 tensor " \
           "cores, which a100-80gb lacks" in err and "\n" not in err
    path.write_text(path.read_text().replace("a100-80gb", "h200"))
    assert main(["run", str(path), "--explain"]) == 0
    out = capsys.readouterr().out
    assert "4 point(s)" in out and "hardware=h200 quantization=fp8" in out
