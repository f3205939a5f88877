"""The interface every attention backend implements.

KV cache layout, one pair per layer: k_cache and v_cache of shape
[num_blocks, block_size, num_kv_heads, head_dim]; token t of a sequence lives in block
block_table[t // block_size] at offset t % block_size.

A backend declares what it serves (`capabilities`) and whether it can be had on this machine
(`missing`); the selector picks by asking these, and the model runner decides CUDA graphs and the C
decoder loop by its capabilities, never by its name.
"""

from abc import ABC, abstractmethod

import torch

from engine_core.attention.capabilities import AttentionSetup, BackendCapabilities
from engine_core.attention.metadata import AttentionMetadata


class AttentionBackend(ABC):
    name: str  # shown in the log
    option: str = ""  # the --attention-backend value it answers to (auto considers every backend)
    capabilities = BackendCapabilities()  # declares no limits and no extras; real backends declare theirs

    @classmethod
    def missing(cls) -> str | None:
        """Why this backend cannot be had on this machine at all (a package not installed, a kernel
        library that did not build), or None when it can."""
        return None

    @classmethod
    def unsupported_reason(cls, setup: AttentionSetup, named: bool = False) -> str | None:
        """Why this backend cannot serve `setup`, or None when it can (see BackendCapabilities)."""
        return cls.capabilities.unsupported_reason(setup, named)

    @abstractmethod
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
                window: int | None = None, softcap: float | None = None) -> torch.Tensor:
        """q [T, H, D], k/v [T, Hkv, D] for the T new tokens. Writes k/v into the cache at
        meta.slot_mapping, then returns causal attention over each sequence's cached keys: [T, H, D].
        window: the layer's sliding window, the query at position p sees keys p - window + 1 .. p and reads
        no key before them (their blocks may hold another request's keys by then); None: keys 0 .. p.
        softcap: the layer's attention logit soft cap c (Gemma 2): each scaled score s becomes c * tanh(s / c)
        before the mask and the softmax; None: scores as they are."""
