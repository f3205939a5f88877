"""bfloat16 linear layers on the CPU through oneDNN, with each weight packed once at load.

oneDNN reorders a weight into the blocked layout its bf16 (AMX / AVX512-BF16) kernels read; plain
F.linear does that reorder on every call. Packing once makes the small matmuls of decode steps about
twice as fast and long prefills no slower. The packed tensor replaces the weight (which is freed,
except a tied LM head's, which the embedding still reads).
"""

import torch
import torch.nn.functional as F

BATCH_HINT = 32  # the row count oneDNN tunes the packed layout for; any row count works


def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    return (device.type == "cpu" and dtype == torch.bfloat16 and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


def pack(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), BATCH_HINT)


def linear(x: torch.Tensor, weight: torch.Tensor, packed: torch.Tensor | None,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T + bias, through the packed weight when there is one."""
    if packed is None:
        return F.linear(x, weight, bias)
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


class PackableWeight:
    """For layers whose `weight` [out, in] multiplies their input: `matmul` goes through the packed
    copy once `pack_weight` has made it."""

    packed_weight: torch.Tensor | None = None
    keeps_weight = False  # True where another layer reads the weight too (a tied LM head's embedding)

    def pack_weight(self) -> None:
        self.packed_weight = pack(self.weight)
        if not self.keeps_weight:
            self.weight.data = self.weight.data.new_empty(0)

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return linear(x, self.weight, self.packed_weight, bias)


def pack_model(model: torch.nn.Module) -> int:
    """Packs every layer that can take it; returns how many."""
    layers = [m for m in model.modules() if isinstance(m, PackableWeight)]
    for layer in layers:
        layer.pack_weight()
    return len(layers)
