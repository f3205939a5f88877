"""The generic CPU attention kernel (paged_fixed_order.c): the attention it computes, and each row's
result bit-identical however the rows are batched, chunked, or preceded by cached blocks."""

import pytest
import torch

from engine_core.cpu_kernels.attention import paged_fixed_order
from tests.support.attention_reference import reference_paged_attention
from tests.support.cpu_tier_helpers import forced_tier, tier_params

pytestmark = [pytest.mark.unit,
              pytest.mark.skipif(paged_fixed_order.load() is None, reason="no C compiler: the kernel is not built")]

BLOCK = 16


def _caches(dtype, num_blocks, num_kv_heads, head_dim, seed):
    g = torch.Generator().manual_seed(seed)
    shape = (num_blocks, BLOCK, num_kv_heads, head_dim)
    return torch.randn(shape, generator=g).to(dtype), torch.randn(shape, generator=g).to(dtype)


def _tables(seq_lens, num_blocks, seed):
    """Each sequence's blocks: distinct, scattered over the pool."""
    order = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed)).tolist()
    width = max(-(-n // BLOCK) for n in seq_lens)
    rows, at = [], 0
    for n in seq_lens:
        used = -(-n // BLOCK)
        rows.append(order[at: at + used] + [0] * (width - used))
        at += used
    return rows


def _attend(q_rows, table_rows, seq_lens, q_lens, k_cache, v_cache, scale=0.3, window=None, softcap=None):
    """The kernel over sequences given as (their query rows, block table, seq_len, q_len)."""
    q = torch.cat(q_rows)
    starts = [0]
    for n in q_lens:
        starts.append(starts[-1] + n)
    args = (q, k_cache, v_cache, torch.tensor(table_rows, dtype=torch.int32), torch.tensor(seq_lens, dtype=torch.int32),
            torch.tensor(starts, dtype=torch.int32), scale)
    out = torch.empty_like(q)
    assert paged_fixed_order.paged_attention(*args, out, window, softcap)
    return out, args


CASES = [  # dtype, heads, kv heads, head dim
    (torch.float32, 4, 2, 16), (torch.bfloat16, 4, 2, 16), (torch.float32, 9, 3, 64),
    (torch.bfloat16, 12, 1, 40), (torch.float32, 2, 2, 7)]


@pytest.mark.parametrize("dtype,heads,kv_heads,head_dim", CASES)
def test_matches_the_reference(dtype, heads, kv_heads, head_dim):
    seq_lens, q_lens = [1, 37, 70, 16, 100], [1, 37, 5, 1, 33]
    k_cache, v_cache = _caches(dtype, 40, kv_heads, head_dim, seed=head_dim)
    tables = _tables(seq_lens, 40, seed=1)
    g = torch.Generator().manual_seed(2)
    q_rows = [torch.randn(n, heads, head_dim, generator=g).to(dtype) for n in q_lens]
    out, args = _attend(q_rows, tables, seq_lens, q_lens, k_cache, v_cache)
    q, _, _, block_tables, lens, starts, scale = args
    expected = reference_paged_attention(q.float(), k_cache.float(), v_cache.float(), starts, lens, block_tables,
                                         scale)
    tolerance = 1e-5 if dtype is torch.float32 else 2**-7
    assert torch.allclose(out.float(), expected, atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_row_does_not_depend_on_batching_chunking_or_threads(dtype):
    heads, kv_heads, head_dim, seq_len = 4, 2, 16, 75
    k_cache, v_cache = _caches(dtype, 30, kv_heads, head_dim, seed=3)
    table = _tables([seq_len], 30, seed=4)[0]
    other_table = _tables([seq_len, 50], 30, seed=4)[1]
    g = torch.Generator().manual_seed(5)
    q = torch.randn(seq_len, heads, head_dim, generator=g).to(dtype)
    # the whole prompt as one prefill chunk: the rows every other arrangement must reproduce
    whole, _ = _attend([q], [table], [seq_len], [seq_len], k_cache, v_cache)
    # each row as a decode (all keys before it "cached")
    decodes, _ = _attend([q[p: p + 1] for p in range(seq_len)], [table] * seq_len, [p + 1 for p in range(seq_len)],
                         [1] * seq_len, k_cache, v_cache)
    assert torch.equal(decodes, whole)
    # chunks of 16 (budget-sized), then odd chunks after a cached prefix of 33
    for cuts in ([0, 16, 32, 48, 64, 75], [0, 33, 40, 41, 75]):
        for a, b in zip(cuts, cuts[1:]):
            chunk, _ = _attend([q[a:b]], [table], [b], [b - a], k_cache, v_cache)
            assert torch.equal(chunk, whole[a:b]), (a, b)
    # beside another sequence's chunk and decodes, at a different position in the batch, on one thread
    other = torch.randn(20, heads, head_dim, generator=g).to(dtype)
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            mixed, _ = _attend([q[74:75], q[40:75], other], [table, table, other_table], [seq_len, seq_len, 50],
                               [1, 35, 20], k_cache, v_cache)
            assert torch.equal(mixed[1:36], whole[40:75])
            assert torch.equal(mixed[:1], whole[74:75])
    finally:
        torch.set_num_threads(threads)


def test_declines_what_it_does_not_take():
    q = torch.randn(2, 4, 16, dtype=torch.float16)
    cache = torch.zeros(4, BLOCK, 2, 16, dtype=torch.float16)
    ints = torch.zeros(2, dtype=torch.int32)
    assert not paged_fixed_order.paged_attention(q, cache, cache, ints[None], ints[:1], ints, 1.0,
                                                     torch.empty_like(q))


def _out_of_window(table_rows, seq_lens, q_lens, window, nan_block):
    """The tables with every block that no query row's window reaches pointed at nan_block."""
    rows = []
    for table, n, q_len in zip(table_rows, seq_lens, q_lens):
        first_seen = max(0, n - q_len - window + 1)  # the first query row's window start
        rows.append([nan_block if (b + 1) * BLOCK <= first_seen else block for b, block in enumerate(table)])
    return rows


@pytest.mark.parametrize("cpu_tier", tier_params("own", "avx2", "portable"))
@pytest.mark.parametrize("dtype,heads,kv_heads,head_dim", [(torch.float32, 4, 2, 16), (torch.bfloat16, 9, 3, 64)])
def test_a_sliding_window_matches_the_reference_and_reads_no_key_before_it(cpu_tier, dtype, heads, kv_heads, head_dim):
    """Windows of 5 (inside a tile) and 40 (across tiles of 32) over decodes, a whole prompt and chunks after
    cached blocks; blocks no row's window reaches hold NaN, which would show in any row that read them."""
    seq_lens, q_lens = [1, 37, 70, 100, 75], [1, 37, 5, 33, 1]
    k_cache, v_cache = _caches(dtype, 41, kv_heads, head_dim, seed=head_dim)
    k_cache[40] = v_cache[40] = float("nan")
    tables = _tables(seq_lens, 40, seed=1)
    g = torch.Generator().manual_seed(2)
    q_rows = [torch.randn(n, heads, head_dim, generator=g).to(dtype) for n in q_lens]
    tolerance = 1e-5 if dtype is torch.float32 else 2**-7
    with forced_tier(cpu_tier):
        for window in (5, 40):
            nan_tables = _out_of_window(tables, seq_lens, q_lens, window, 40)
            assert nan_tables != tables
            out, args = _attend(q_rows, nan_tables, seq_lens, q_lens, k_cache, v_cache, window=window)
            q, _, _, _, lens, starts, scale = args
            expected = reference_paged_attention(q.float(), k_cache.float(), v_cache.float(), starts, lens,
                                                 torch.tensor(tables), scale, window)
            assert torch.allclose(out.float(), expected, atol=tolerance, rtol=tolerance), window


@pytest.mark.parametrize("cpu_tier", tier_params("own", "portable"))
def test_a_windowed_row_does_not_depend_on_chunking(cpu_tier):
    heads, kv_heads, head_dim, seq_len, window = 4, 2, 16, 75, 20
    k_cache, v_cache = _caches(torch.float32, 30, kv_heads, head_dim, seed=3)
    table = _tables([seq_len], 30, seed=4)[0]
    q = torch.randn(seq_len, heads, head_dim, generator=torch.Generator().manual_seed(5))
    with forced_tier(cpu_tier):
        whole, _ = _attend([q], [table], [seq_len], [seq_len], k_cache, v_cache, window=window)
        decodes, _ = _attend([q[p: p + 1] for p in range(seq_len)], [table] * seq_len,
                             [p + 1 for p in range(seq_len)], [1] * seq_len, k_cache, v_cache, window=window)
        chunks, _ = _attend([q[:23], q[23:61], q[61:]], [table] * 3, [23, 61, 75], [23, 38, 14], k_cache, v_cache,
                            window=window)
    assert torch.equal(decodes, whole) and torch.equal(chunks, whole)


@pytest.mark.parametrize("cpu_tier", tier_params("own", "avx2", "portable"))
@pytest.mark.parametrize("dtype,heads,kv_heads,head_dim", [(torch.float32, 4, 2, 16), (torch.bfloat16, 9, 3, 64)])
def test_soft_capped_scores_match_the_reference(cpu_tier, dtype, heads, kv_heads, head_dim):
    """Gemma 2's attn_logit_softcapping: caps of 0.5 and 2.0 bind on these scores (the uncapped result is far
    off), with and without a sliding window; float32 within 1e-5 of torch's tanh."""
    seq_lens, q_lens = [1, 37, 70, 100, 75], [1, 37, 5, 33, 1]
    k_cache, v_cache = _caches(dtype, 40, kv_heads, head_dim, seed=head_dim)
    tables = _tables(seq_lens, 40, seed=1)
    g = torch.Generator().manual_seed(2)
    q_rows = [(3 * torch.randn(n, heads, head_dim, generator=g)).to(dtype) for n in q_lens]
    tolerance = 1e-5 if dtype is torch.float32 else 2**-7
    with forced_tier(cpu_tier):
        for softcap, window in ((2.0, None), (0.5, None), (2.0, 20)):
            out, args = _attend(q_rows, tables, seq_lens, q_lens, k_cache, v_cache, window=window, softcap=softcap)
            q, _, _, block_tables, lens, starts, scale = args
            expected = reference_paged_attention(q.float(), k_cache.float(), v_cache.float(), starts, lens,
                                                 block_tables, scale, window, softcap)
            uncapped = reference_paged_attention(q.float(), k_cache.float(), v_cache.float(), starts, lens,
                                                 block_tables, scale, window)
            assert torch.allclose(out.float(), expected, atol=tolerance, rtol=tolerance), (softcap, window)
            assert not torch.allclose(out.float(), uncapped, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("cpu_tier", tier_params("own", "portable"))
def test_a_capped_row_does_not_depend_on_chunking(cpu_tier):
    """The tanh runs eight lanes at a time and one at a time for a tile's tail: a score's cap is the same bits
    wherever it falls, so chunks, decodes and the whole prompt agree exactly."""
    heads, kv_heads, head_dim, seq_len, softcap = 4, 2, 16, 75, 2.0
    k_cache, v_cache = _caches(torch.float32, 30, kv_heads, head_dim, seed=3)
    table = _tables([seq_len], 30, seed=4)[0]
    q = 3 * torch.randn(seq_len, heads, head_dim, generator=torch.Generator().manual_seed(5))
    with forced_tier(cpu_tier):
        whole, _ = _attend([q], [table], [seq_len], [seq_len], k_cache, v_cache, softcap=softcap)
        decodes, _ = _attend([q[p: p + 1] for p in range(seq_len)], [table] * seq_len,
                             [p + 1 for p in range(seq_len)], [1] * seq_len, k_cache, v_cache, softcap=softcap)
        assert torch.equal(decodes, whole)
        for cuts in ([0, 16, 32, 48, 64, 75], [0, 33, 40, 41, 75]):
            for a, b in zip(cuts, cuts[1:]):
                chunk, _ = _attend([q[a:b]], [table], [b], [b - a], k_cache, v_cache, softcap=softcap)
                assert torch.equal(chunk, whole[a:b]), (a, b)


def test_the_c_tanh_is_accurate():
    """The kernel's tanh (softcap_f32.h) against float64 over scores from tiny to saturated, read through
    attention: with a cap of 1, two keys scoring s and 0 and values 1 and 0, the output is sigmoid(tanh(s))."""
    s = torch.linspace(-12, 12, 4001, dtype=torch.float64)
    k_cache = torch.zeros(1, BLOCK, 1, 1)
    v_cache = torch.zeros(1, BLOCK, 1, 1)
    k_cache[0, 0, 0, 0], k_cache[0, 1, 0, 0] = 1.0, 0.0  # score of key 0: q * scale; of key 1: 0
    v_cache[0, 0, 0, 0] = 1.0
    q = s.float().reshape(-1, 1, 1)
    n = q.shape[0]
    out = torch.empty_like(q)
    ints = lambda values: torch.tensor(values, dtype=torch.int32)  # noqa: E731
    assert paged_fixed_order.paged_attention(q, k_cache, v_cache, ints([[0]] * n), ints([2] * n),
                                                 ints(list(range(n + 1))), 1.0, out, None, 1.0)
    expected = torch.sigmoid(torch.tanh(s.float().double()))  # float64
    assert (out.double().flatten() - expected).abs().max() < 3e-7
