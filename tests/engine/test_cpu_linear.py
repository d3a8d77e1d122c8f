"""Packed oneDNN linears compute what nn.Linear computes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from kvplan.engine.cpu_linear import PackedLinear, can_pack, pack_linears

pytestmark = pytest.mark.skipif(not can_pack(nn.Linear(4, 4).to(torch.bfloat16)),
                                reason="this torch build or CPU lacks oneDNN bf16 packed linears")


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 48), (7, 48), (1, 130, 48)])
def test_packed_linear_equals_nn_linear(bias, shape):
    torch.manual_seed(0)
    linear = nn.Linear(48, 80, bias=bias).to(torch.bfloat16)
    x = torch.randn(shape, dtype=torch.bfloat16)
    expected = linear(x).float()
    got = PackedLinear(linear, batch_hint=16)(x)
    assert got.shape == (*shape[:-1], 80) and got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), expected, atol=2e-2, rtol=1.6e-2)


def test_pack_linears_swaps_every_linear_of_a_bf16_model_and_keeps_its_outputs(tiny_models):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_models["tiny-llama"], dtype=torch.bfloat16).eval()
    ids = torch.tensor([[5, 9, 13, 2, 7, 7, 1, 30]])
    with torch.inference_mode():
        expected = model(ids).logits.float()
        linears = sum(type(m) is nn.Linear for m in model.modules())
        assert can_pack(model) and pack_linears(model) == linears > 0
        assert not any(type(m) is nn.Linear for m in model.modules())
        got = model(ids).logits.float()
    torch.testing.assert_close(got, expected, atol=5e-2, rtol=5e-2)
    assert not can_pack(nn.Linear(4, 4))  # float32 stays on the plain path
