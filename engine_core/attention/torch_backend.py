"""Attention in plain torch: works on any device; the reference backend and the CPU one.

Decodes are batched: their keys are gathered through the block tables (padded to the longest,
masked) and each KV head's query group attends with two batched matmuls. On CPU this beats SDPA
by several times in bfloat16. Prefill chunks take the same path one at a time: a chunk with
nothing cached before it attends to its own keys, one that follows cached blocks gathers them,
and both mask causally with an offset. Gather indices and masks are built once per step and
shared by all layers.
"""

import torch

from engine_core.attention.backend import AttentionBackend
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
    """q [B, Q, H, D], k/v [B, L, Hkv, D], additive mask broadcastable to [B, 1, 1, Q, L]."""
    B, Q, H, D = q.shape
    Hkv = k.shape[2]
    qg = q.view(B, Q, Hkv, H // Hkv, D).permute(0, 2, 3, 1, 4)  # [B, Hkv, G, Q, D]
    kt = k.permute(0, 2, 3, 1).unsqueeze(2)  # [B, Hkv, 1, D, L]
    scores = torch.matmul(qg, kt).float() * scale + mask
    probs = torch.softmax(scores, dim=-1).to(q.dtype)
    out = torch.matmul(probs, v.permute(0, 2, 1, 3).unsqueeze(2))  # [B, Hkv, G, Q, D]
    return out.permute(0, 3, 1, 2, 4).reshape(B, Q, H, D)


class TorchAttentionBackend(AttentionBackend):
    name = "torch"

    def forward(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        write_kv_cache(k, v, k_cache, v_cache, meta.slot_mapping)
        out = torch.empty_like(q)
        nd = meta.num_decodes
        if nd:
            slots, mask = self._decode_plan(meta, k_cache.shape[1])
            keys, values = gather(k_cache, slots), gather(v_cache, slots)
            out[:nd] = grouped_attention(q[:nd].unsqueeze(1), keys, values, mask, scale).squeeze(1)
        starts = meta.query_start_loc_cpu
        for i in range(nd, meta.num_seqs):
            lo, hi = starts[i], starts[i + 1]
            out[lo:hi] = self._prefill(q[lo:hi], k[lo:hi], v[lo:hi], k_cache, v_cache, meta, i, scale)
        return out

    def _decode_plan(self, meta: AttentionMetadata, block_size: int):
        plan = meta.extras.get("torch_decode")
        if plan is None:
            nd = meta.num_decodes
            length = max(meta.seq_lens_cpu[:nd])
            slots = token_slots(meta.block_tables[:nd], block_size, length)
            valid = torch.arange(length, device=slots.device)[None, :] < meta.seq_lens[:nd, None]
            mask = torch.zeros(valid.shape, device=slots.device).masked_fill_(~valid, float("-inf"))
            plan = meta.extras["torch_decode"] = (slots, mask[:, None, None, None, :])
        return plan

    def _prefill(self, q, k, v, k_cache, v_cache, meta, i, scale):
        q_len, seq_len = q.shape[0], meta.seq_lens_cpu[i]
        key = ("torch_prefill", i)
        plan = meta.extras.get(key)
        if plan is None:
            cached = seq_len > q_len
            slots = token_slots(meta.block_tables[i: i + 1], k_cache.shape[1], seq_len) if cached else None
            qpos = torch.arange(q_len, device=q.device)[:, None] + (seq_len - q_len)
            allowed = torch.arange(seq_len, device=q.device)[None, :] <= qpos
            mask = torch.zeros(allowed.shape, device=q.device).masked_fill_(~allowed, float("-inf"))
            plan = meta.extras[key] = (slots, mask)
        slots, mask = plan
        if slots is None:  # nothing cached before this chunk: its own keys are all it sees
            keys, values = k.unsqueeze(0), v.unsqueeze(0)
        else:
            keys, values = gather(k_cache, slots), gather(v_cache, slots)
        return grouped_attention(q.unsqueeze(0), keys, values, mask, scale)[0]
