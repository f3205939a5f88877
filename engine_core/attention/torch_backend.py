"""Attention in plain torch: works on any device; the reference backend and the CPU one.

Decodes are batched into one SDPA call over keys gathered through their block tables (padded to
the longest, masked); each prefill chunk runs its own SDPA with a causal mask offset by the
tokens already cached before it.
"""

import torch
import torch.nn.functional as F

from engine_core.attention.backend import AttentionBackend
from engine_core.attention.metadata import AttentionMetadata


def write_kv_cache(k, v, k_cache, v_cache, slot_mapping) -> None:
    Hkv, D = k_cache.shape[-2:]
    k_cache.view(-1, Hkv, D).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, Hkv, D).index_copy_(0, slot_mapping, v)


def gather_kv(cache: torch.Tensor, block_tables: torch.Tensor, length: int) -> torch.Tensor:
    """[B, length, Hkv, D]: each sequence's first `length` cached tokens, in order."""
    block_size = cache.shape[1]
    num_blocks = (length + block_size - 1) // block_size
    blocks = cache[block_tables[:, :num_blocks]]  # [B, nb, bs, Hkv, D]
    return blocks.flatten(1, 2)[:, :length]


class TorchAttentionBackend(AttentionBackend):
    name = "torch"

    def forward(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        write_kv_cache(k, v, k_cache, v_cache, meta.slot_mapping)
        out = torch.empty_like(q)
        nd = meta.num_decodes
        if nd:
            out[:nd] = self._decode(q[:nd], k_cache, v_cache, meta, scale)
        starts = meta.query_start_loc_cpu
        for i in range(nd, meta.num_seqs):
            lo, hi = starts[i], starts[i + 1]
            out[lo:hi] = self._prefill(q[lo:hi], k[lo:hi], v[lo:hi], k_cache, v_cache, meta, i, scale)
        return out

    def _decode(self, q, k_cache, v_cache, meta, scale):
        nd = meta.num_decodes
        max_len = max(meta.seq_lens_cpu[:nd])
        tables = meta.block_tables[:nd]
        keys = gather_kv(k_cache, tables, max_len).transpose(1, 2)  # [B, Hkv, L, D]
        values = gather_kv(v_cache, tables, max_len).transpose(1, 2)
        valid = torch.arange(max_len, device=q.device)[None, :] < meta.seq_lens[:nd, None]
        mask = valid[:, None, None, :]  # [B, 1, 1, L]
        out = F.scaled_dot_product_attention(q.unsqueeze(2), keys, values, attn_mask=mask, scale=scale,
                                             enable_gqa=True)
        return out.squeeze(2)

    def _prefill(self, q, k, v, k_cache, v_cache, meta, i, scale):
        q_len, seq_len = q.shape[0], meta.seq_lens_cpu[i]
        if seq_len == q_len:  # nothing cached before this chunk: use its own keys
            keys, values, mask, causal = k, v, None, True
        else:
            table = meta.block_tables[i: i + 1]
            keys = gather_kv(k_cache, table, seq_len)[0]
            values = gather_kv(v_cache, table, seq_len)[0]
            offset = seq_len - q_len
            qpos = torch.arange(q_len, device=q.device)[:, None] + offset
            mask, causal = torch.arange(seq_len, device=q.device)[None, :] <= qpos, False
        out = F.scaled_dot_product_attention(q.transpose(0, 1), keys.transpose(0, 1), values.transpose(0, 1),
                                             attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=True)
        return out.transpose(0, 1)
