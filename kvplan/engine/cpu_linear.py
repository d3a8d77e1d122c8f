"""Linear layers with weights packed once for oneDNN, for bf16/fp16 models on CPU.

`F.linear` in bf16 on CPU goes through oneDNN, which reorders the weight into its blocked layout on every call;
for the small token counts of decode steps that reorder costs about as much as the product. Packing each weight
once at load time (what torch's own inductor does for frozen CPU graphs) removes it. The HF modules stay
unmodified: only their `nn.Linear` children are swapped for `PackedLinear`, which computes the same product.
"""

from __future__ import annotations

import torch
from torch import nn

PACKABLE_DTYPES = (torch.bfloat16, torch.float16)


def can_pack(model: nn.Module) -> bool:
    """True for a CPU model in bf16/fp16 when this torch build has oneDNN's packed linear with support for it."""
    param = next(model.parameters(), None)
    if param is None or param.device.type != "cpu" or param.dtype not in PACKABLE_DTYPES:
        return False
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return False
    if param.dtype == torch.bfloat16:
        return torch.ops.mkldnn._is_mkldnn_bf16_supported()
    return torch.ops.mkldnn._is_mkldnn_fp16_supported()


class PackedLinear(nn.Module):
    def __init__(self, linear: nn.Linear, batch_hint: int) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach()
        # The packed layout depends on the expected number of rows; it serves any number, tuned for this one.
        self.register_buffer("packed_weight", torch.ops.mkldnn._reorder_linear_weight(weight, batch_hint),
                             persistent=False)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed=oneDNN"


def pack_linears(model: nn.Module, batch_hint: int = 64) -> int:
    """Swap every `nn.Linear` of `model` for a `PackedLinear`; returns how many were swapped."""
    swapped = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(module, name, PackedLinear(child, batch_hint))
                swapped += 1
    return swapped
