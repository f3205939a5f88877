"""The CPU C kernels (paged_avx512_bf16.c through paged_avx512_bf16.py) as an attention backend.

On bfloat16 CPUs with AVX512-BF16 the kernels read the paged cache in place: the decodes in one call
to the decode kernel, all prefill chunks of a step (with or without cached blocks before them) in one
call to the chunk kernel, with no gathered copy and no mask. It answers to `--attention-backend torch`
(and auto) where the kernels can be had and take the model's shapes, so those runs are as fast as the
C decoder loop (cpu_kernels/decoder/loop_avx512_bf16.py), which calls the same kernels and may run the layers instead.
A call the kernels decline all the same (a tensor not laid out as they read it) goes to the torch
backend's path, whose code this backend inherits. paged_avx512_bf16.c does not cap scores: a soft-capped layer
(Gemma 2) runs the generic C kernel (paged_fixed_order.c, bf16 too, batch-invariant as well).

Batch-invariant (engine_core/platform/batch_invariance.py, the default): decodes go through the chunk kernel
too, as one-row chunks. The decode kernel sums a row's scores in another order, so a token computed
as a decode would differ in its last bits from the same token computed in a prefill chunk (a prompt
whose prefix was cached, a recomputation after preemption, a speculative verification). Costs nothing measurable here: a one-row item reads its keys as fast in
the chunk kernel as in the decode kernel (0.85-0.87 ms a layer for 32 decodes of W32's lengths).
"""

import logging

import torch

from engine_core.cpu_kernels.attention import paged_avx512_bf16
from engine_core.attention.capabilities import BackendCapabilities
from engine_core.cpu_kernels.attention.paged_avx512_bf16 import paged_attention, paged_decode_attention
from engine_core.attention.cpu_generic_backend import generic_attention
from engine_core.attention.metadata import AttentionMetadata
from engine_core.attention.torch_backend import TorchAttentionBackend, write_kv_cache
from engine_core.platform.batch_invariance import batch_invariant

logger = logging.getLogger("nvllm")
_declined_before = False  # warned once per process


def _warn_declined(q: torch.Tensor, k_cache: torch.Tensor) -> None:
    # the selector only picks this backend for shapes the kernel takes: this is a layout the caller made
    global _declined_before
    if _declined_before:
        return
    _declined_before = True
    logger.warning("the CPU chunk attention kernel declined q %s (stride %s), caches %s: this step's attention "
                   "ran through SDPA and is not batch-invariant", tuple(q.shape), q.stride(), tuple(k_cache.shape))


class CpuKernelAttentionBackend(TorchAttentionBackend):
    name = "cpu_kernel"
    option = "torch"
    # the shapes paged_avx512_bf16.c takes (its -1 return otherwise); keep in step with it
    capabilities = BackendCapabilities(
        label="the CPU attention kernels", devices=frozenset({"cpu"}), dtypes=(torch.bfloat16,),
        head_dim_multiple=32, max_head_dim=256, max_group=8, fused_cpu_decoder=True, batch_invariant=True)

    @classmethod
    def missing(cls) -> str | None:
        if paged_avx512_bf16.load() is None:
            return ("the CPU attention kernels (paged_avx512_bf16.c) are not built here: they need AVX512-BF16 and a C "
                    "compiler, and NVLLM_CPU_DECODE_KERNEL=0 turns them off")
        return None

    def forward(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale: float,
                window: int | None = None, softcap: float | None = None) -> torch.Tensor:
        if softcap is not None:  # paged_avx512_bf16.c does not cap scores: a capped layer takes the generic C kernel
            return self._capped(q, k, v, k_cache, v_cache, meta, scale, window, softcap)
        if not batch_invariant():
            return super().forward(q, k, v, k_cache, v_cache, meta, scale, window)
        write_kv_cache(k, v, k_cache, v_cache, meta.slot_mapping)
        out = torch.empty_like(q)
        # every row the same way, one-token rows included (see the module's docstring)
        if paged_attention(q, k_cache, v_cache, meta.block_tables, meta.seq_lens, meta.query_start_loc, scale, out,
                           window):
            return out
        _warn_declined(q, k_cache)
        return super().forward(q, k, v, k_cache, v_cache, meta, scale, window)

    def _capped(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale: float, window: int | None,
                softcap: float) -> torch.Tensor:
        """A soft-capped layer (Gemma 2) through paged_fixed_order.c, batch-invariant as the chunk kernel;
        the torch path where that declines."""
        out = generic_attention(q, k, v, k_cache, v_cache, meta, scale, window, softcap)
        return out if out is not None else super().forward(q, k, v, k_cache, v_cache, meta, scale, window, softcap)

    def _decodes(self, q, k_cache, v_cache, meta: AttentionMetadata, scale: float, out: torch.Tensor,
                 window: int | None = None, softcap: float | None = None) -> None:
        nd = meta.num_decodes
        if softcap is not None:
            return super()._decodes(q, k_cache, v_cache, meta, scale, out, window, softcap)
        if not paged_decode_attention(q[:nd], k_cache, v_cache, meta.block_tables[:nd], meta.seq_lens[:nd],
                                      scale, out[:nd], window):
            super()._decodes(q, k_cache, v_cache, meta, scale, out, window)

    def _prefills(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale: float, out: torch.Tensor,
                  window: int | None = None, softcap: float | None = None) -> None:
        nd = meta.num_decodes
        if softcap is not None:
            return super()._prefills(q, k, v, k_cache, v_cache, meta, scale, out, window, softcap)
        if not paged_attention(q, k_cache, v_cache, meta.block_tables[nd:], meta.seq_lens[nd:],
                               meta.query_start_loc[nd:], scale, out, window):
            super()._prefills(q, k, v, k_cache, v_cache, meta, scale, out, window)
