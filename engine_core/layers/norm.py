import torch
from torch import nn

from engine_core.layers import cpu_ops


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        # in float32, as transformers does, so float32 runs match it to rounding
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """With a residual, adds it first and returns (normed, new residual).

        bfloat16 on AVX512 CPUs: one fused pass (cpu_ops), bit-identical; with a residual it works in
        place, so x and residual are overwritten by the results."""
        fused = cpu_ops.rms_norm(x, residual, self.weight, self.eps)
        if fused is not None:
            return fused
        if residual is None:
            return self._norm(x)
        x = x + residual
        return self._norm(x), x
