import torch
from torch import nn

from engine_core.platform.batch_invariance import batch_invariant
from engine_core.cpu_kernels.ops import fused_ops, rms_fixed_order


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6, offset: float = 0.0):
        """offset: scale by (offset + weight) (Gemma's 1). Such a norm keeps offset + weight in float32 and scales
        before rounding to the model's dtype, as transformers' Gemma does; the fused kernels take no offset."""
        super().__init__()
        self.eps = eps
        self.offset = offset
        if offset:
            self.weight = nn.Parameter(torch.full((hidden_size,), offset, dtype=torch.float32), requires_grad=False)
            self.weight.weight_loader = self._load_with_offset
        else:
            self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)

    def _load_with_offset(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        param.data.copy_(loaded.float() + self.offset)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        # in float32, as transformers does, so float32 runs match it to rounding
        dtype = x.dtype
        x = x.float()
        # batch-invariant: the statistic from a fixed-order row kernel (torch may split one row's sum
        # across threads when a step has few rows, see rms_fixed_order.c); the elementwise rest is per row anyway
        scale = rms_fixed_order.inverse_rms(x, self.eps) if batch_invariant() else None
        if scale is None:
            scale = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.offset:
            return (self.weight * (x * scale)).to(dtype)
        return self.weight * (x * scale).to(dtype)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """With a residual, adds it first and returns (normed, new residual).

        bfloat16 on AVX512 CPUs: one fused pass (fused_ops), bit-identical; with a residual it works in
        place, so x and residual are overwritten by the results."""
        # an offset norm's float32 weight holds offset + weight, so in float32 the kernel's weight * (x * scale)
        # is _norm's arithmetic; in bf16 it would round before scaling, where Gemma scales first
        fused = (None if self.offset and x.dtype is not torch.float32
                 else fused_ops.rms_norm(x, residual, self.weight, self.eps))
        if fused is not None:
            return fused
        if residual is None:
            return self._norm(x)
        x = x + residual
        return self._norm(x), x
