"""Attention in plain torch: works on any device and dtype; the reference backend.

torch's scaled_dot_product_attention with grouped-query heads (`enable_gqa`), over keys viewed as
[B, Hkv, L, D] without copying them. Decodes are batched: their keys are gathered through the block
tables (padded to the longest, masked). Prefill chunks go one at a time: a chunk with nothing cached
before it attends causally to its own keys; one that follows cached blocks gathers them and masks
causally with an offset. Gather indices and masks are built once per step and shared by all layers
(torch_plan.py). A sliding-window layer (`window`: the query at p sees keys p - window + 1 .. p) gathers
only the keys inside its rows' windows, masked to each row's own. A soft-capped layer (`softcap`, Gemma 2)
spells the attention out in matmuls, as SDPA takes no cap. On bfloat16 CPUs the C kernels take over
(cpu_kernel_backend.py), handing back what they decline to these same paths.
"""

import torch
import torch.nn.functional as F

from engine_core.attention.backend import AttentionBackend
from engine_core.attention.capabilities import BackendCapabilities
from engine_core.attention.metadata import AttentionMetadata
from engine_core.attention.torch_plan import TorchPlan


def write_kv_cache(k, v, k_cache, v_cache, slot_mapping) -> None:
    Hkv, D = k_cache.shape[-2:]
    k_cache.view(-1, Hkv, D).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, Hkv, D).index_copy_(0, slot_mapping, v)


def gather(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """cache rows at slots: [*slots.shape, Hkv, D]."""
    Hkv, D = cache.shape[-2:]
    return cache.view(-1, Hkv, D).index_select(0, slots.flatten()).view(*slots.shape, Hkv, D)


def grouped_attention(q, k, v, mask, scale, softcap=None):
    """q [B, Q, H, D], k/v [B, L, Hkv, D]; mask: additive, broadcastable to [B, 1, Q, L] in q's
    dtype, or None for plain causal attention (Q == L); softcap: the scores' soft cap, None: none.
    Returns [B, Q, H, D]."""
    if softcap is not None:
        return capped_attention(q, k, v, mask, scale, softcap)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         attn_mask=mask, is_causal=mask is None, scale=scale, enable_gqa=True)
    return out.transpose(1, 2)


def capped_attention(q, k, v, mask, scale, softcap):
    """grouped_attention with soft-capped scores, spelled out (SDPA has no cap): the scaled scores s become
    softcap * tanh(s / softcap), then the mask, then a float32 softmax, as transformers' Gemma 2 eager
    attention orders them."""
    group = q.shape[2] // k.shape[2]
    keys = k.repeat_interleave(group, dim=2).transpose(1, 2)  # [B, H, L, D]
    values = v.repeat_interleave(group, dim=2).transpose(1, 2)
    scores = torch.matmul(q.transpose(1, 2), keys.transpose(2, 3)) * scale  # [B, H, Q, L]
    scores = torch.tanh(scores / softcap) * softcap
    if mask is None:  # plain causal: Q == L
        length = scores.shape[-1]
        mask = torch.ones(length, length, dtype=torch.bool, device=q.device).tril_().logical_not_()
        scores = scores.masked_fill(mask, float("-inf"))
    else:
        scores = scores + mask
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs, values).transpose(1, 2)


class TorchAttentionBackend(AttentionBackend):
    name = "torch"
    option = "torch"
    # any device and dtype; decode steps size their gathers from host-side lengths, so no CUDA graphs
    capabilities = BackendCapabilities(label="the torch attention backend")

    def forward(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale: float,
                window: int | None = None, softcap: float | None = None) -> torch.Tensor:
        write_kv_cache(k, v, k_cache, v_cache, meta.slot_mapping)
        out = torch.empty_like(q)
        if meta.num_decodes:
            self._decodes(q, k_cache, v_cache, meta, scale, out, window, softcap)
        if meta.num_decodes < meta.num_seqs:
            self._prefills(q, k, v, k_cache, v_cache, meta, scale, out, window, softcap)
        return out

    def _decodes(self, q, k_cache, v_cache, meta: AttentionMetadata, scale: float, out: torch.Tensor,
                 window: int | None = None, softcap: float | None = None) -> None:
        """out[:num_decodes]: the decodes' rows, in one batch."""
        nd = meta.num_decodes
        plan = TorchPlan.of(meta)
        keys_of = (plan.decode_gather(meta, k_cache.shape[1], q.dtype) if window is None
                   else plan.windowed_decode_gather(meta, k_cache.shape[1], q.dtype, window))
        keys, values = gather(k_cache, keys_of.slots), gather(v_cache, keys_of.slots)
        out[:nd] = grouped_attention(q[:nd].unsqueeze(1), keys, values, keys_of.mask, scale,
                                         softcap).squeeze(1)

    def _prefills(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale: float, out: torch.Tensor,
                  window: int | None = None, softcap: float | None = None) -> None:
        """The prefill chunks' rows of out, one chunk at a time."""
        starts = meta.query_start_loc_cpu
        for i in range(meta.num_decodes, meta.num_seqs):
            lo, hi = starts[i], starts[i + 1]
            out[lo:hi] = self._prefill(q[lo:hi], k[lo:hi], v[lo:hi], k_cache, v_cache, meta, i, scale, window,
                                         softcap)

    def _prefill(self, q, k, v, k_cache, v_cache, meta, i, scale, window=None, softcap=None):
        q_len, seq_len = q.shape[0], meta.seq_lens_cpu[i]
        if window is not None and seq_len > window:  # some row's window starts after key 0
            plan = TorchPlan.of(meta).windowed_prefill_gather(meta, i, q_len, k_cache.shape[1], q.dtype, window)
            keys, values = gather(k_cache, plan.slots), gather(v_cache, plan.slots)
            return grouped_attention(q.unsqueeze(0), keys, values, plan.mask, scale, softcap)[0]
        if seq_len == q_len:  # nothing cached before this chunk: its own keys are all it sees
            return grouped_attention(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), None, scale, softcap)[0]
        plan = TorchPlan.of(meta).prefill_gather(meta, i, q_len, k_cache.shape[1], q.dtype)
        keys, values = gather(k_cache, plan.slots), gather(v_cache, plan.slots)
        return grouped_attention(q.unsqueeze(0), keys, values, plan.mask, scale, softcap)[0]
