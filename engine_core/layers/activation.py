import torch
from torch import nn

from engine_core.cpu_kernels.ops import fused_ops


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for x = [gate | up] (the fused gate_up projection's output, [T, 2n]) -> [T, n].

    bfloat16 on AVX512 CPUs: one fused pass (fused_ops), bit-identical to the torch code below."""
    out = fused_ops.silu_and_mul(x)
    if out is not None:
        return out
    gate, up = x.chunk(2, dim=-1)
    return nn.functional.silu(gate) * up


def act_and_mul(x: torch.Tensor, activation: str) -> torch.Tensor:
    """activation(gate) * up for x = [gate | up], activation a ModelSpec.activation (as transformers computes it)."""
    if activation == "silu":
        return silu_and_mul(x)
    gate, up = x.chunk(2, dim=-1)
    if activation == "gelu_tanh":
        # float32 on the CPU: the kernel the C decoder loop calls too, so both give the same bits
        out = fused_ops.gelu_tanh_and_mul(x)
        return out if out is not None else nn.functional.gelu(gate, approximate="tanh") * up
    if activation == "gelu":
        return nn.functional.gelu(gate) * up
    raise ValueError(f"activation {activation!r} is not implemented")
