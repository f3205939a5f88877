"""Attention through flash-attn 2 (GPU; optional: `pip install 'nvllm[cuda]'`).

The new keys and values go into the paged cache with the Triton store kernel (a slot < 0, a padding
row of a CUDA-graph batch, is skipped). Then the decodes (the first num_decodes sequences, one query
token each) attend through `flash_attn_with_kvcache` and the prefill chunks through
`flash_attn_varlen_func`, both reading the cache through the block table, so a chunk that follows a
cached prefix sees it. Neither call syncs with the host, so decode steps can be graph-captured. A
sliding-window layer passes flash-attn's window_size (w - 1, 0): with causal=True the query at p sees
keys p - (w - 1) .. p, transformers' window of w keys; flash-attn skips the key tiles wholly before it.
A soft-capped layer (Gemma 2) passes flash-attn's softcap, applied to the scaled scores before
the mask, as transformers does.

flash-attn 2 reads a paged cache only in pages of a multiple of 256 tokens (its docstring: "page_block_size
must be a multiple of 256"; its C++ checks `page_block_size % 256 == 0`), only in fp16/bf16 and for head
dims that are multiples of 8 up to 256: its capabilities. `unsupported_reason` says what rules a
configuration out; the selector then falls back to triton (auto) or refuses (`--attention-backend flash_attn`).
"""

import importlib.util
from dataclasses import dataclass

import torch

from engine_core.attention.backend import AttentionBackend
from engine_core.attention.capabilities import AttentionSetup, BackendCapabilities
from engine_core.attention.metadata import AttentionMetadata, AttentionPlan

PAGE_MULTIPLE = 256  # flash-attn 2's paged kernels need pages of a multiple of this many tokens


def unsupported_reason(block_size: int, dtype: torch.dtype, head_dim: int) -> str | None:
    """Why flash-attn 2 cannot serve this configuration on a GPU, or None when it can."""
    return FlashAttnBackend.unsupported_reason(AttentionSetup("cuda", dtype, block_size, 1, 1, head_dim))


class FlashAttnBackend(AttentionBackend):
    name = "flash_attn"
    option = "flash_attn"
    # its calls take the lengths and tables as device tensors and never sync: decode steps can be captured
    capabilities = BackendCapabilities(
        label="flash-attn", devices=frozenset({"cuda"}), dtypes=(torch.float16, torch.bfloat16),
        block_size_multiple=PAGE_MULTIPLE, head_dim_multiple=8, max_head_dim=256, cuda_graphs=True)

    @classmethod
    def missing(cls) -> str | None:
        if importlib.util.find_spec("flash_attn") is None:
            return "attention_backend flash_attn needs the flash-attn package: pip install 'nvllm[cuda]'"
        return None

    @classmethod
    def unsupported_reason(cls, setup: AttentionSetup, named: bool = False) -> str | None:
        # the block size first, in flash-attn 2's own terms: it is what rules flash-attn out most often
        if setup.block_size % cls.capabilities.block_size_multiple:
            return (f"flash-attn 2 reads a paged KV cache only in blocks of a multiple of "
                    f"{cls.capabilities.block_size_multiple} tokens, and --block-size is {setup.block_size}")
        return super().unsupported_reason(setup, named)

    def __init__(self):
        from flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache
        self._varlen = flash_attn_varlen_func
        self._with_kvcache = flash_attn_with_kvcache

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
                window: int | None = None, softcap: float | None = None) -> torch.Tensor:
        from engine_core.attention import triton_kernels  # triton only once a GPU step runs

        window_size = (-1, -1) if window is None else (window - 1, 0)  # (-1, -1): no window
        cap = {} if softcap is None else {"softcap": softcap}  # flash-attn >= 2.6; older ones run uncapped layers

        triton_kernels.store_kvcache(k, v, k_cache, v_cache, meta.slot_mapping)
        out = torch.empty_like(q)
        nd = meta.num_decodes
        if nd:
            # the decodes as a batch of one-token queries [nd, 1, H, D] over their cached keys
            out[:nd] = self._with_kvcache(
                q[:nd].unsqueeze(1), k_cache, v_cache, cache_seqlens=meta.seq_lens[:nd],
                block_table=meta.block_tables[:nd], softmax_scale=scale, causal=True,
                window_size=window_size, **cap).squeeze(1)
        if nd < meta.num_seqs:
            lo = meta.query_start_loc_cpu[nd]
            plan = FlashPrefillPlan.of(meta)
            out[lo:] = self._varlen(
                q[lo:], k_cache, v_cache, plan.cu_q, plan.cu_k, meta.max_query_len, meta.max_seq_len,
                softmax_scale=scale, causal=True, window_size=window_size, block_table=meta.block_tables[nd:],
                **cap)
        return out


@dataclass(frozen=True)
class FlashPrefillPlan(AttentionPlan):
    """The cumulative query and key lengths of a step's prefill chunks, as flash_attn_varlen_func takes them."""
    cu_q: torch.Tensor  # int32 [num prefill seqs + 1]: query rows, from 0 at the first chunk
    cu_k: torch.Tensor  # int32 [num prefill seqs + 1]: cached keys (prefix + new)

    @staticmethod
    def of(meta: AttentionMetadata) -> "FlashPrefillPlan":
        """The step's plan, built by the first layer that asks."""
        if not isinstance(meta.plan, FlashPrefillPlan):
            meta.plan = FlashPrefillPlan._build(meta)
        return meta.plan

    @staticmethod
    def _build(meta: AttentionMetadata) -> "FlashPrefillPlan":
        nd = meta.num_decodes
        starts = meta.query_start_loc[nd:]
        cu_q = (starts - starts[:1]).to(torch.int32)
        cu_k = torch.zeros(meta.num_seqs - nd + 1, dtype=torch.int32, device=starts.device)
        cu_k[1:] = torch.cumsum(meta.seq_lens[nd:], dim=0)
        return FlashPrefillPlan(cu_q, cu_k)
