"""Attention through Triton kernels over the paged KV cache (GPU; the kernels also run on CPU under
TRITON_INTERPRET=1, which is how the tests check them)."""

import torch

from engine_core.attention.backend import AttentionBackend
from engine_core.attention.metadata import AttentionMetadata
from engine_core.attention import triton_kernels


class TritonAttentionBackend(AttentionBackend):
    name = "triton"

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        triton_kernels.store_kvcache(k, v, k_cache, v_cache, meta.slot_mapping)
        return triton_kernels.paged_attention(q, k_cache, v_cache, meta.query_start_loc, meta.seq_lens,
                                              meta.block_tables, scale, meta.max_query_len, meta.max_seq_len)
