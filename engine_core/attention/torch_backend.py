"""Attention in plain torch: works on any device; the reference backend and the CPU one.

In bfloat16 on CPUs with AVX512-BF16, C kernels (cpu_decode_kernel.py) read the paged cache in place:
decodes go to the decode kernel, and all prefill chunks of a step (with or without cached blocks
before them) to the chunk kernel in one call, with no gathered copy and no mask.
Everything else (float32 models, other devices and CPUs, shapes the kernels decline) uses torch's
scaled_dot_product_attention with grouped-query heads (`enable_gqa`), over keys viewed as
[B, Hkv, L, D] without copying them. Decodes are batched: their keys are gathered through the block
tables (padded to the longest, masked). Prefill chunks go one at a time: a chunk with nothing cached
before it attends causally to its own keys; one that follows cached blocks gathers them and masks
causally with an offset. Gather indices and masks are built once per step and shared by all layers.
"""

import torch
import torch.nn.functional as F

from engine_core.attention.backend import AttentionBackend
from engine_core.attention.cpu_decode_kernel import paged_attention, paged_decode_attention
from engine_core.attention.metadata import AttentionMetadata


def write_kv_cache(k, v, k_cache, v_cache, slot_mapping) -> None:
    Hkv, D = k_cache.shape[-2:]
    k_cache.view(-1, Hkv, D).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, Hkv, D).index_copy_(0, slot_mapping, v)


def token_slots(block_tables: torch.Tensor, block_size: int, length: int) -> torch.Tensor:
    """[B, length] cache slots of each sequence's first `length` tokens."""
    num_blocks = (length + block_size - 1) // block_size
    offsets = torch.arange(block_size, device=block_tables.device)
    slots = block_tables[:, :num_blocks, None].long() * block_size + offsets
    return slots.flatten(1)[:, :length]


def gather(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """cache rows at slots: [*slots.shape, Hkv, D]."""
    Hkv, D = cache.shape[-2:]
    return cache.view(-1, Hkv, D).index_select(0, slots.flatten()).view(*slots.shape, Hkv, D)


def grouped_attention(q, k, v, mask, scale):
    """q [B, Q, H, D], k/v [B, L, Hkv, D]; mask: additive, broadcastable to [B, 1, Q, L] in q's
    dtype, or None for plain causal attention (Q == L). Returns [B, Q, H, D]."""
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         attn_mask=mask, is_causal=mask is None, scale=scale, enable_gqa=True)
    return out.transpose(1, 2)


class TorchAttentionBackend(AttentionBackend):
    name = "torch"

    def forward(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        write_kv_cache(k, v, k_cache, v_cache, meta.slot_mapping)
        out = torch.empty_like(q)
        nd = meta.num_decodes
        if nd and not paged_decode_attention(q[:nd], k_cache, v_cache, meta.block_tables[:nd], meta.seq_lens[:nd],
                                             scale, out[:nd]):
            slots, mask = self._decode_plan(meta, k_cache.shape[1], q.dtype)
            keys, values = gather(k_cache, slots), gather(v_cache, slots)
            out[:nd] = grouped_attention(q[:nd].unsqueeze(1), keys, values, mask, scale).squeeze(1)
        if nd == meta.num_seqs or paged_attention(q, k_cache, v_cache, meta.block_tables[nd:], meta.seq_lens[nd:],
                                                  meta.query_start_loc[nd:], scale, out):
            return out
        starts = meta.query_start_loc_cpu
        for i in range(nd, meta.num_seqs):
            lo, hi = starts[i], starts[i + 1]
            out[lo:hi] = self._prefill(q[lo:hi], k[lo:hi], v[lo:hi], k_cache, v_cache, meta, i, scale)
        return out

    def _decode_plan(self, meta: AttentionMetadata, block_size: int, dtype: torch.dtype):
        plan = meta.extras.get("torch_decode")
        if plan is None:
            nd = meta.num_decodes
            length = max(meta.seq_lens_cpu[:nd])
            slots = token_slots(meta.block_tables[:nd], block_size, length)
            valid = torch.arange(length, device=slots.device)[None, :] < meta.seq_lens[:nd, None]
            mask = torch.zeros(valid.shape, dtype=dtype, device=slots.device).masked_fill_(~valid, float("-inf"))
            plan = meta.extras["torch_decode"] = (slots, mask[:, None, None, :])
        return plan

    def _prefill(self, q, k, v, k_cache, v_cache, meta, i, scale):
        q_len, seq_len = q.shape[0], meta.seq_lens_cpu[i]
        if seq_len == q_len:  # nothing cached before this chunk: its own keys are all it sees
            return grouped_attention(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), None, scale)[0]
        key = ("torch_prefill", i)
        plan = meta.extras.get(key)
        if plan is None:
            slots = token_slots(meta.block_tables[i: i + 1], k_cache.shape[1], seq_len)
            qpos = torch.arange(q_len, device=q.device)[:, None] + (seq_len - q_len)
            allowed = torch.arange(seq_len, device=q.device)[None, :] <= qpos
            mask = torch.zeros(allowed.shape, dtype=q.dtype, device=q.device).masked_fill_(~allowed, float("-inf"))
            plan = meta.extras[key] = (slots, mask)
        slots, mask = plan
        keys, values = gather(k_cache, slots), gather(v_cache, slots)
        return grouped_attention(q.unsqueeze(0), keys, values, mask, scale)[0]
