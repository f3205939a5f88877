"""Attention through Triton kernels over the paged KV cache (GPU; the kernels also run on CPU under
TRITON_INTERPRET=1, which is how the tests check them, so a CPU run may name it but auto never takes it).

Batch-invariant by default: a row's attention output is the same bits however its step is made up
(triton_kernels.py says why); --no-batch-invariant lets decode-only steps take a faster tiling."""

import importlib

import torch

from engine_core.attention.backend import AttentionBackend
from engine_core.attention.capabilities import BackendCapabilities
from engine_core.attention.metadata import AttentionMetadata


class TritonAttentionBackend(AttentionBackend):
    name = "triton"
    option = "triton"
    # every per-step value is read from device tensors inside the kernels and the grid is sized from
    # tensor shapes alone (in either invariance mode): decode steps can be captured
    capabilities = BackendCapabilities(label="the triton attention backend", devices=frozenset({"cuda"}),
                                       named_only_devices=frozenset({"cpu"}), cuda_graphs=True)

    def __init__(self):
        # imported only once chosen: the selector reads this class on machines where triton must not load yet
        self._kernels = importlib.import_module("engine_core.attention.triton_kernels")

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
                window: int | None = None, softcap: float | None = None) -> torch.Tensor:
        self._kernels.store_kvcache(k, v, k_cache, v_cache, meta.slot_mapping)
        return self._kernels.paged_attention(q, k_cache, v_cache, meta.query_start_loc, meta.seq_lens,
                                             meta.block_tables, scale, meta.max_query_len, meta.max_seq_len,
                                             window=window, softcap=softcap)
