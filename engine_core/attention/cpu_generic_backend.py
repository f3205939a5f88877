"""The generic CPU attention kernel (paged_fixed_order.c) as an attention backend.

Batch-invariant runs only (engine_core/platform/batch_invariance.py, the default): on CPU setups the C kernels
of cpu_kernel_backend.py do not take (float32, bf16 head dims not a multiple of 32 or above 256,
groups of more than 8 query heads, CPUs without AVX512-BF16), the selector takes this one for
`--attention-backend torch` and auto instead of SDPA, whose shapes (and so a row's sum order) change
with the batch: decodes gathered together, each prefill chunk on its own, chunks after cached blocks
with a mask. Here every row of a step, decode or chunk, runs the same per-row code.

With --no-batch-invariant it declares itself unsupported, so the selection is the torch backend as
before. A call the kernel declines all the same (a layout it does not read) goes to the torch
backend's path, whose code this backend inherits, with a warning once.
"""

import logging

import torch

from engine_core.cpu_kernels.attention import paged_fixed_order
from engine_core.attention.capabilities import AttentionSetup, BackendCapabilities
from engine_core.attention.metadata import AttentionMetadata
from engine_core.attention.torch_backend import TorchAttentionBackend, write_kv_cache
from engine_core.platform.batch_invariance import batch_invariant

logger = logging.getLogger("nvllm")
_declined_before = False  # warned once per process


class CpuGenericAttentionBackend(TorchAttentionBackend):
    name = "cpu_generic"
    option = "torch"
    capabilities = BackendCapabilities(label="the generic CPU attention kernel", devices=frozenset({"cpu"}),
                                       dtypes=paged_fixed_order.DTYPES, batch_invariant=True,
                                       fused_cpu_decoder=True)

    @classmethod
    def missing(cls) -> str | None:
        if paged_fixed_order.load() is None:
            return ("the generic CPU attention kernel (paged_fixed_order.c) is not built here: it needs a C "
                    "compiler, and NVLLM_CPU_GENERIC_ATTENTION=0 turns it off")
        return None

    @classmethod
    def unsupported_reason(cls, setup: AttentionSetup, named: bool = False) -> str | None:
        if not batch_invariant():
            return f"{cls.capabilities.label} serves batch-invariant runs only"
        return super().unsupported_reason(setup, named)

    def forward(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale: float,
                window: int | None = None, softcap: float | None = None) -> torch.Tensor:
        out = generic_attention(q, k, v, k_cache, v_cache, meta, scale, window, softcap)
        return out if out is not None else super().forward(q, k, v, k_cache, v_cache, meta, scale, window, softcap)


def generic_attention(q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale: float, window: int | None,
                      softcap: float | None) -> torch.Tensor | None:
    """The step's keys and values written, then every row through paged_fixed_order.c; None (warned once)
    where the kernel declines, for the caller's torch path."""
    write_kv_cache(k, v, k_cache, v_cache, meta.slot_mapping)
    out = torch.empty_like(q)
    if paged_fixed_order.paged_attention(q, k_cache, v_cache, meta.block_tables, meta.seq_lens,
                                             meta.query_start_loc, scale, out, window, softcap):
        return out
    _warn_declined(q, k_cache)
    return None


def _warn_declined(q: torch.Tensor, k_cache: torch.Tensor) -> None:
    global _declined_before
    if not _declined_before:
        _declined_before = True
        logger.warning("the generic CPU attention kernel declined q %s (stride %s), caches %s: this step's attention "
                       "ran through SDPA and is not batch-invariant", tuple(q.shape), q.stride(), tuple(k_cache.shape))
