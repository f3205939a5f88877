"""The interface every attention backend implements.

KV cache layout, one pair per layer: k_cache and v_cache of shape
[num_blocks, block_size, num_kv_heads, head_dim]; token t of a sequence lives in block
block_table[t // block_size] at offset t % block_size.
"""

from abc import ABC, abstractmethod

import torch

from engine_core.attention.metadata import AttentionMetadata


class AttentionBackend(ABC):
    name: str

    @abstractmethod
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        """q [T, H, D], k/v [T, Hkv, D] for the T new tokens. Writes k/v into the cache at
        meta.slot_mapping, then returns causal attention over each sequence's cached keys: [T, H, D]."""
