"""A plain, obviously-correct paged attention in torch, one sequence at a time: the reference the attention
backends and kernels are tested against. Slow; only tests use it."""

import torch


def reference_paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                              query_start_loc, seq_lens, block_tables, scale: float,
                              window: int | None = None, softcap: float | None = None) -> torch.Tensor:
    """q [T, H, D]; caches [num_blocks, block_size, Hkv, D]; query_start_loc [num_seqs + 1],
    seq_lens [num_seqs], block_tables [num_seqs, max_blocks] (tensors or lists).
    Sequence i's query rows are its last query_len tokens; query at position p sees keys 0..p, or with a sliding
    window keys p - window + 1 .. p (transformers' convention: kv_idx > q_idx - window). softcap: each scaled
    score s becomes softcap * tanh(s / softcap) before the mask (transformers' Gemma 2 order).
    Returns [T, H, D] in q's dtype, computed in fp32. Rows no sequence owns are zero."""
    starts = [int(x) for x in query_start_loc]
    lens = [int(x) for x in seq_lens]
    tables = block_tables.tolist() if isinstance(block_tables, torch.Tensor) else block_tables
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = q.shape[1] // num_kv_heads
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    for i, seq_len in enumerate(lens):
        lo, hi = starts[i], starts[i + 1]
        q_len = hi - lo
        if q_len == 0:
            continue
        positions = torch.arange(seq_len, device=q.device)
        blocks = torch.tensor([tables[i][t // block_size] for t in range(seq_len)], device=q.device)
        offsets = positions % block_size
        keys = k_cache[blocks, offsets].float()  # [S, Hkv, D]
        values = v_cache[blocks, offsets].float()
        keys = keys.repeat_interleave(group, dim=1)  # [S, H, D]: query head h uses kv head h // group
        values = values.repeat_interleave(group, dim=1)
        query = q[lo:hi].float()  # [L, H, D]
        scores = torch.einsum("lhd,shd->hls", query, keys) * scale  # [H, L, S]
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)
        causal = positions[None, :] <= q_pos[:, None]  # [L, S]
        if window is not None:
            causal &= positions[None, :] > q_pos[:, None] - window
        scores = scores.masked_fill(~causal, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[lo:hi] = torch.einsum("hls,shd->lhd", probs, values)
    return out.to(q.dtype)
