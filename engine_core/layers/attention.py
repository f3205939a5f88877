"""Attention over the paged KV cache; the backend named in the forward context does the work."""

import torch
from torch import nn

from engine_core.layers.forward_context import get_forward_context


class PagedAttention(nn.Module):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float,
                 sliding_window: int | None = None, softcap: float | None = None):
        super().__init__()
        self.softcap = softcap  # the scores' soft cap (c * tanh(s / c)), None: none
        self.sliding_window = sliding_window  # this layer's window (keys p - w + 1 .. p), None: all keys
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        # bound by the model runner once the cache is allocated
        self.k_cache = torch.empty(0)
        self.v_cache = torch.empty(0)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        ctx = get_forward_context()
        return ctx.backend.forward(q, k, v, self.k_cache, self.v_cache, ctx.meta, self.scale, self.sliding_window,
                                    self.softcap)
