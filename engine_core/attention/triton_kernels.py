"""Triton kernels for the paged KV cache: writing new keys/values and attending over them.

Cache layout (see backend.py): k_cache, v_cache [num_blocks, block_size, num_kv_heads, head_dim];
token t of a sequence sits in block block_table[t // block_size] at offset t % block_size, i.e. at
slot block_id * block_size + offset.

`paged_attention` is one launch for a whole mixed batch (decodes and prefill chunks, each chunk
possibly following a cached prefix). Its grid is (query blocks, kv heads):

* A program owns one kv head and BLOCK_M "rows"; a row is (query token, query head of that kv head's
  group), token-major, so BLOCK_Q = BLOCK_M // group tokens of one sequence share every K/V tile they
  load (GQA costs no extra K/V traffic). The tiles come from triton_tiles.py: in batch-invariant
  mode one tiling for every step; with --no-batch-invariant a pure decode batch takes the smallest
  tile that holds the group, so a program is one (sequence, kv head) with all its query heads.
* Sequence i gets at most query_len_i // BLOCK_Q + 1 programs; program ids are laid out so that
  sequence i starts at query_start_loc[i] // BLOCK_Q + i. The grid is therefore sized from shapes
  alone (num_tokens // BLOCK_Q + num_seqs, no host sync) and each program finds its sequence by a
  binary search over query_start_loc; programs past the end of their sequence return at once.
* The program walks the sequence's keys 0 .. (last key any of its rows can see) in tiles of BLOCK_N
  keys, gathering each key through the block table (so any block size works and tiles need not align
  with blocks), with an online softmax in fp32 (exp2, running max and sum) and fp32 accumulation.
  Query token j of a chunk of length L in a sequence of length S sits at position S - L + j and sees
  keys 0 .. S - L + j; with a sliding window w (a layer's, SLIDING) keys S - L + j - w + 1 .. S - L + j,
  and the program starts at the tile holding its first row's first key: keys before it are never
  loaded (their blocks may belong to another request by then).

Batch invariance (the default; batch_invariance.py). The output row of the query at position p is
the same bits whether p is a decode, anywhere in a prefill chunk of any length, after a cached
prefix, at any index of any batch, with its blocks anywhere in the cache, because:
* one compiled kernel (one tiling, triton_tiles.invariant_tiles; no specialization on per-step
  integers) serves every step;
* key tiles start at absolute positions 0, BLOCK_N, 2 * BLOCK_N, ... and the row passes through
  exactly the tiles 0 .. p // BLOCK_N (tiles past p, or wholly before its window, there for
  tile-mates, scale its state by exactly 1 and add zeros); inside its last tile the keys past p (and
  in its first those before its window) are masked to -inf, so they add exact zeros; the sign of a
  zero result is made +0.0;
* no split over keys: one program walks all of a row's keys, in order;
* each row keeps its own running max, sum and accumulator; the dots and row reductions compute
  each row from that row alone, in an order fixed by the compiled kernel (on a GPU the MMA
  instruction and reduction layout; in the interpreter numpy sums of fixed shapes).
Keys past the sequence's length are never loaded (masked loads), so stale or NaN cache slots
cannot reach a row.
"""

import torch
import triton
import triton.language as tl

from engine_core.attention.triton_tiles import invariant_tiles, padded_head_dim, shape_tuned_tiles
from engine_core.platform.batch_invariance import batch_invariant

_LOG2E = 1.4426950408889634


@triton.jit
def _store_kvcache_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_kcb, stride_kco, stride_kch,
    stride_vcb, stride_vco, stride_vch,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    HEADS_PAD: tl.constexpr, DIM_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot < 0:  # padding token: nothing to store
        return
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    h = tl.arange(0, HEADS_PAD)
    d = tl.arange(0, DIM_PAD)
    mask = (h[:, None] < NUM_KV_HEADS) & (d[None, :] < HEAD_DIM)
    k = tl.load(k_ptr + t * stride_kt + h[:, None] * stride_kh + d[None, :], mask=mask)
    v = tl.load(v_ptr + t * stride_vt + h[:, None] * stride_vh + d[None, :], mask=mask)
    kc = k_cache_ptr + block * stride_kcb + offset * stride_kco + h[:, None] * stride_kch + d[None, :]
    vc = v_cache_ptr + block * stride_vcb + offset * stride_vco + h[:, None] * stride_vch + d[None, :]
    tl.store(kc, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(vc, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def _last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def store_kvcache(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  slot_mapping: torch.Tensor) -> None:
    """Write k, v [T, Hkv, D] into k_cache, v_cache [num_blocks, block_size, Hkv, D] at
    slot_mapping[t] (block_id * block_size + offset); a slot < 0 is skipped."""
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    assert k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1, "cache head_dim must be contiguous"
    k, v = _last_dim_contiguous(k), _last_dim_contiguous(v)
    _store_kvcache_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim,
        HEADS_PAD=triton.next_power_of_2(num_kv_heads), DIM_PAD=triton.next_power_of_2(head_dim),
        BLOCK_SIZE=k_cache.shape[1],
    )


@triton.jit
def _mma(a, b, IEEE_DOT: tl.constexpr, UPCAST: tl.constexpr):
    """a @ b with fp32 accumulation."""
    if UPCAST:
        # Interpreter only. Its tl.dot multiplies bf16 operands as their raw uint16 storage, and its
        # np.matmul goes through a multi-threaded BLAS that crawls on a busy 2-core machine: a
        # broadcast product summed in fp32 is exact enough and fast in numpy.
        c = tl.sum(a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :], axis=1)
    elif IEEE_DOT:
        c = tl.dot(a, b, input_precision="ieee")
    else:
        c = tl.dot(a, b)
    return c


# Per-step integers are not specialized (a value of 1 or a multiple of 16 would compile another
# kernel): the block tables are as wide as the step's longest sequence needs.
@triton.jit
def _soft_cap(s, cap):
    """cap * tanh(s / cap), tanh|x| as (1 - e^(-2|x|)) / (1 + e^(-2|x|)) with the sign put back (no overflow)."""
    x = s / cap
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t) * cap


@triton.jit(do_not_specialize=["num_seqs", "stride_bt", "window", "softcap"])
def _paged_attention_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr,
    query_start_loc_ptr, seq_lens_ptr, block_tables_ptr,
    qk_scale,  # softmax scale * log2(e): scores are kept in base 2
    num_seqs,
    window,  # SLIDING: keys a query sees back from its own position, itself included
    softcap,  # SOFTCAP: the scores' cap times log2(e) (scores are in base 2: cap * tanh(s / cap) keeps its form)
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_kb, stride_ko, stride_kh,
    stride_vb, stride_vo, stride_vh,
    stride_bt,
    BLOCK_SIZE: tl.constexpr,  # tokens per cache block
    GROUP: tl.constexpr,  # query heads per kv head
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,  # rows (token, head) per program
    BLOCK_Q: tl.constexpr,  # query tokens per program = BLOCK_M // GROUP
    BLOCK_N: tl.constexpr,  # keys per tile
    IEEE_DOT: tl.constexpr,  # fp32 inputs: exact fp32 dots, not tf32
    UPCAST: tl.constexpr,  # interpreter only: dot operands in fp32 (values already rounded)
    INVARIANT: tl.constexpr,  # rows pass through exactly their own key tiles (see the loop)
    SLIDING: tl.constexpr,  # a sliding-window layer: `window` applies
    SOFTCAP: tl.constexpr,  # a soft-capped layer (Gemma 2): `softcap` applies, before the mask
):
    pid = tl.program_id(0)
    kv_head = tl.program_id(1)

    # which sequence: the last i with query_start_loc[i] // BLOCK_Q + i <= pid
    lo = num_seqs * 0
    hi = num_seqs + 0
    while lo < hi:
        mid = (lo + hi) // 2
        first_pid = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        right = first_pid <= pid
        lo = tl.where(right, mid + 1, lo)
        hi = tl.where(right, hi, mid)
    seq = lo - 1

    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    first_tok = (pid - (q_start // BLOCK_Q + seq)) * BLOCK_Q  # first query token (within the chunk)
    if first_tok >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    context_len = seq_len - q_len  # cached tokens before this chunk

    rows = tl.arange(0, BLOCK_M)
    tok = first_tok + rows // GROUP
    head = kv_head * GROUP + rows % GROUP
    row_valid = (rows < BLOCK_Q * GROUP) & (tok < q_len)
    q_pos = context_len + tok
    d = tl.arange(0, HEAD_DIM_PAD)
    if HEAD_DIM == HEAD_DIM_PAD:  # no column mask: keeps the masks 1-D and the registers free
        d_valid = tl.full([HEAD_DIM_PAD], 1, tl.int1)
    else:
        d_valid = d < HEAD_DIM

    q_rows = (q_start + tok).to(tl.int64)
    q = tl.load(q_ptr + q_rows[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
                mask=row_valid[:, None] & d_valid[None, :], other=0.0)

    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)  # running max (base-2 scores)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)  # running sum of exp2
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)

    # keys 0 .. kv_end - 1 are visible to at least one row of this program
    kv_end = context_len + tl.minimum(first_tok + BLOCK_Q, q_len)
    if SLIDING:  # from the first key the first row's window holds, in tiles aligned to absolute positions
        kv_begin = tl.maximum(context_len + first_tok - window + 1, 0)
        first_tile = kv_begin // BLOCK_N * BLOCK_N
    else:
        first_tile = 0
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    for n0 in range(first_tile, kv_end, BLOCK_N):
        k_pos = n0 + tl.arange(0, BLOCK_N)
        if SLIDING:
            k_valid = (k_pos < kv_end) & (k_pos >= kv_begin)
        else:
            k_valid = k_pos < kv_end
        block = tl.load(table + k_pos // BLOCK_SIZE, mask=k_valid, other=0).to(tl.int64)
        offset = k_pos % BLOCK_SIZE
        kv_mask = k_valid[:, None] & d_valid[None, :]
        k = tl.load(k_cache_ptr + (block * stride_kb + offset * stride_ko + kv_head * stride_kh)[:, None]
                    + d[None, :], mask=kv_mask, other=0.0)
        k = k.to(q.dtype)
        s = _mma(q, tl.trans(k), IEEE_DOT, UPCAST) * qk_scale
        if SOFTCAP:
            s = _soft_cap(s, softcap)
        visible = (k_pos[None, :] <= q_pos[:, None]) & k_valid[None, :]
        if SLIDING:
            visible = visible & (k_pos[None, :] > q_pos[:, None] - window)
        s = tl.where(visible, s, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        if INVARIANT:
            # A tile wholly before a row's position is here only for a tile-mate. All its scores are
            # -inf, so m_new == m_i and p == 0; scaling by exactly 1 (not by exp2(0), which a GPU
            # approximates) leaves m, l and acc as they were, up to the sign of an exact zero.
            if SLIDING:  # likewise a tile wholly before the row's window
                alpha = tl.where((n0 <= q_pos) & (n0 + BLOCK_N > q_pos - window + 1), alpha, 1.0)
            else:
                alpha = tl.where(n0 <= q_pos, alpha, 1.0)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)

        v = tl.load(v_cache_ptr + (block * stride_vb + offset * stride_vo + kv_head * stride_vh)[:, None]
                    + d[None, :], mask=kv_mask, other=0.0)
        v = v.to(q.dtype)
        acc = acc * alpha[:, None] + _mma(p.to(v.dtype), v, IEEE_DOT, UPCAST)
        m_i = m_new

    l_i = tl.where(l_i == 0.0, 1.0, l_i)  # only rows that are masked out anyway
    acc = acc / l_i[:, None]
    if INVARIANT:
        # Masked keys and skipped tiles add exact zeros (0 * v, v a real key or a masked-out load), so
        # a row's result can differ between batches in nothing but the sign of an exact zero (from an
        # underflow, or how an MMA signs a sum of zeros). x + 0.0 is x, except -0.0 becomes +0.0
        # (IEEE; compilers keep it unless told that signed zeros do not matter, which Triton does not).
        acc = acc + 0.0
    tl.store(out_ptr + q_rows[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :],
             acc.to(out_ptr.dtype.element_ty), mask=row_valid[:, None] & d_valid[None, :])


# TRITON_INTERPRET is read when a kernel is decorated, so ask the kernel, not the environment
_INTERPRETED = type(_paged_attention_kernel).__name__ == "InterpretedFunction"


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_tables: torch.Tensor,
                    scale: float, max_query_len: int, max_seq_len: int,
                    out: torch.Tensor | None = None, invariant: bool | None = None,
                    window: int | None = None, softcap: float | None = None) -> torch.Tensor:
    """Causal attention of q [T, H, D] over each sequence's paged keys/values -> out [T, H, D].

    Sequence i owns query rows query_start_loc[i]:query_start_loc[i+1] (its last query_len tokens,
    at positions seq_lens[i] - query_len ..) and keys 0 .. seq_lens[i] - 1 through block_tables[i].
    max_seq_len is accepted for the backend interface but not needed (each program reads its own
    length on the device). No host sync. window: a sliding window, the query at p sees keys
    p - window + 1 .. p (no key before them is loaded); None: keys 0 .. p. softcap: each scaled score s
    becomes softcap * tanh(s / softcap) before the mask (Gemma 2); None: no cap.

    invariant (default: the process switch, batch_invariance.batch_invariant()): one tiling for every
    step and rows that pass through exactly their own key tiles, so each row's bits depend on its
    sequence's q/k/v up to its position alone. Off: max_query_len may pick a decode-only tiling.
    """
    num_tokens, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    assert num_heads % num_kv_heads == 0, "query heads must be a multiple of kv heads"
    assert k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1, "cache head_dim must be contiguous"
    group = num_heads // num_kv_heads
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    num_seqs = seq_lens.shape[0]
    if num_tokens == 0 or num_seqs == 0:
        return out
    q = _last_dim_contiguous(q)
    block_tables = _last_dim_contiguous(block_tables)
    assert out.stride(-1) == 1, "out head_dim must be contiguous"

    if invariant is None:
        invariant = batch_invariant()
    if invariant:
        block_m, block_n, num_warps = invariant_tiles(group, head_dim, q.element_size())
    else:
        block_m, block_n, num_warps = shape_tuned_tiles(group, head_dim, q.element_size(), max_query_len)
    block_q = block_m // group
    grid = (num_tokens // block_q + num_seqs, num_kv_heads)
    _paged_attention_kernel[grid](
        q, k_cache, v_cache, out,
        query_start_loc, seq_lens, block_tables,
        scale * _LOG2E, num_seqs, window or 0, (softcap or 1.0) * _LOG2E,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0),
        BLOCK_SIZE=block_size, GROUP=group,
        HEAD_DIM=head_dim, HEAD_DIM_PAD=padded_head_dim(head_dim),
        BLOCK_M=block_m, BLOCK_Q=block_q, BLOCK_N=block_n,
        IEEE_DOT=q.dtype == torch.float32, UPCAST=_INTERPRETED, INVARIANT=invariant, SLIDING=window is not None,
        SOFTCAP=softcap is not None,
        num_warps=num_warps, num_stages=2,
    )
    return out
