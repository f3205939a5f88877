"""The CPU paged attention kernel for any number of query rows per sequence (C, AVX512-BF16): against the
plain reference, row by row bit-identical however the rows are batched or chunked, and in the torch backend."""

import pytest
import torch

from engine_core.cpu_kernels.attention import paged_avx512_bf16
from engine_core.cpu_kernels.attention.paged_avx512_bf16 import paged_attention
from engine_core.attention.cpu_kernel_backend import CpuKernelAttentionBackend
from engine_core.attention.metadata import AttentionMetadata
from engine_core.attention.torch_backend import TorchAttentionBackend
from tests.support.attention_reference import reference_paged_attention

pytestmark = pytest.mark.integration

needs_kernel = pytest.mark.skipif(paged_avx512_bf16.load() is None,
                                  reason="needs a CPU with AVX512-BF16 and a C compiler (the kernel is not built here)")


def _case(num_heads, num_kv_heads, head_dim, block_size, seqs, seed=0):
    """seqs: (query rows, seq_len) per sequence. Blocks scattered over the pool, tables padded, the
    cache's unwritten slots full of NaN (the kernel must never let them through)."""
    g = torch.Generator().manual_seed(seed)
    num_blocks = sum(-(-n // block_size) for _, n in seqs) + 8
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=torch.bfloat16)
    v_cache = torch.full(shape, float("nan"), dtype=torch.bfloat16)
    order = torch.randperm(num_blocks, generator=g)
    tables = torch.zeros(len(seqs), max(-(-n // block_size) for _, n in seqs) + 3, dtype=torch.int32)
    used = 0
    for i, (_, n) in enumerate(seqs):
        count = -(-n // block_size)
        tables[i, :count] = order[used:used + count]
        used += count
        slots = tables[i, :count].long()[:, None] * block_size + torch.arange(block_size)
        slots = slots.flatten()[:n]
        k_cache.view(-1, num_kv_heads, head_dim)[slots] = torch.randn(n, num_kv_heads, head_dim, generator=g).bfloat16()
        v_cache.view(-1, num_kv_heads, head_dim)[slots] = torch.randn(n, num_kv_heads, head_dim, generator=g).bfloat16()
    starts = [0]
    for q_len, _ in seqs:
        starts.append(starts[-1] + q_len)
    q = (torch.randn(starts[-1], num_heads, head_dim, generator=g) * 2).to(torch.bfloat16)
    seq_lens = torch.tensor([n for _, n in seqs], dtype=torch.int32)
    return q, k_cache, v_cache, tables, seq_lens, torch.tensor(starts, dtype=torch.int32)


@needs_kernel
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim,block_size", [
    (9, 3, 64, 16),  # SmolLM2's shape
    (4, 4, 64, 1), (8, 2, 128, 32), (16, 4, 64, 16), (16, 8, 128, 16), (8, 8, 128, 16), (8, 1, 64, 32),
    (12, 2, 64, 16), (6, 2, 96, 5), (2, 1, 256, 16),  # the general instance: group 6, head dims 96 and 256
])
def test_kernel_matches_reference(num_heads, num_kv_heads, head_dim, block_size):
    # decodes, whole prompts, chunks after cached prefixes (aligned to 16 or not), one long chunk
    seqs = [(1, 1), (1, 40), (1, 300), (17, 17), (33, 33), (5, 100), (64, 80), (16, 48), (31, 77), (600, 600)]
    q, k_cache, v_cache, tables, seq_lens, starts = _case(num_heads, num_kv_heads, head_dim, block_size, seqs)
    out = torch.full_like(q, float("nan"))
    assert paged_attention(q, k_cache, v_cache, tables, seq_lens, starts, head_dim**-0.5, out)
    expected = reference_paged_attention(q, k_cache, v_cache, starts, seq_lens, tables, head_dim**-0.5)
    # bfloat16 inputs, probabilities and output: a few units in the last place of bf16
    torch.testing.assert_close(out.float(), expected.float(), atol=2e-2, rtol=2e-2)


@needs_kernel
def test_long_chunk_after_cached_prefix_matches_reference():
    seqs = [(600, 1500), (1, 1500)]
    q, k_cache, v_cache, tables, seq_lens, starts = _case(9, 3, 64, 16, seqs, seed=3)
    out = torch.empty_like(q)
    assert paged_attention(q, k_cache, v_cache, tables, seq_lens, starts, 0.125, out)
    expected = reference_paged_attention(q, k_cache, v_cache, starts, seq_lens, tables, 0.125)
    torch.testing.assert_close(out.float(), expected.float(), atol=2e-2, rtol=2e-2)


@needs_kernel
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim,block_size", [(9, 3, 64, 16), (8, 2, 128, 5), (6, 2, 96, 32)])
def test_a_row_is_bit_identical_however_it_is_batched_or_chunked(num_heads, num_kv_heads, head_dim, block_size):
    """Rows of one prompt computed within a 512-row chunk, as the last row of a shorter chunk over a cached
    prefix, alone (q_len 1), and in a batch with other sequences: the same bits."""
    length = 512
    q, k_cache, v_cache, tables, seq_lens, _ = _case(num_heads, num_kv_heads, head_dim, block_size, [(length, length)])
    scale = head_dim**-0.5

    def run(rows, seq_len, q_rows, extra=()):
        """rows: this prompt's query rows (the last of its first seq_len tokens); extra: other
        sequences (q, q_len, seq_len) put before it in the batch, sharing its cache and table."""
        qs, lens, starts, table_rows = [], [], [0], []
        for eq, eq_len, e_len in extra:
            qs.append(eq), lens.append(e_len), starts.append(starts[-1] + eq_len), table_rows.append(tables[0])
        qs.append(q_rows), lens.append(seq_len), starts.append(starts[-1] + rows), table_rows.append(tables[0])
        batch_q = torch.cat(qs)
        out = torch.empty_like(batch_q)
        assert paged_attention(batch_q, k_cache, v_cache, torch.stack(table_rows), torch.tensor(lens, dtype=torch.int32),
                               torch.tensor(starts, dtype=torch.int32), scale, out)
        return out[-rows:]

    whole = run(length, length, q)  # the whole prompt in one chunk
    # around the 16-key parts and the 64-key tiles: a row takes its own 64-key tile whole from position 63 on
    # (and where a row's diagonal tile grows from 1 to 4 parts of 16 keys: 15/16, 31/32, 47/48)
    for p in [0, 1, 15, 16, 17, 31, 32, 47, 48, 62, 63, 64, 100, 127, 128, 255, 256, 300, 511]:
        alone = run(1, p + 1, q[p:p + 1])  # as a decode would compute it
        assert torch.equal(whole[p], alone[0]), p
        for chunk in [2, 7, 33, 64]:  # the last row of a chunk whose first tokens came from the cache
            if chunk <= p + 1:
                assert torch.equal(whole[p], run(chunk, p + 1, q[p + 1 - chunk:p + 1])[-1]), (p, chunk)
    # the prompt chunked in pieces of 100 rows, each after the cached pieces before it, batched with others
    for lo in range(0, length, 100):
        hi = min(lo + 100, length)
        others = ((q[:3], 3, 3), (q[:1], 1, 200), (q[:40], 40, 90))
        assert torch.equal(whole[lo:hi], run(hi - lo, hi, q[lo:hi], others)), lo


def _meta(seqs, seq_lens, starts, tables, num_decodes):
    return AttentionMetadata(slot_mapping=torch.empty(0, dtype=torch.int64), query_start_loc=starts,
                             seq_lens=seq_lens, block_tables=tables, max_query_len=max(q for q, _ in seqs),
                             max_seq_len=max(n for _, n in seqs), num_decodes=num_decodes,
                             query_start_loc_cpu=starts.tolist(), seq_lens_cpu=seq_lens.tolist())


@needs_kernel
def test_backend_prefills_through_the_kernel_and_equal_sdpa(monkeypatch):
    """A mixed step (decodes, a whole prompt, chunks after cached blocks) goes to the kernel in one call for all
    its chunks, and equals the backend's SDPA path to bf16 rounding."""
    seqs = [(1, 40), (1, 7), (70, 70), (16, 48), (100, 333), (1, 1)]
    q, k_cache, v_cache, tables, seq_lens, starts = _case(9, 3, 64, 16, seqs, seed=1)
    meta = _meta(seqs, seq_lens, starts, tables, num_decodes=2)
    empty = torch.empty(0, 3, 64, dtype=torch.bfloat16)  # k and v: already in the cache
    meta.slot_mapping = torch.empty(0, dtype=torch.int64)
    calls = []
    real = paged_attention
    monkeypatch.setattr("engine_core.attention.cpu_kernel_backend.paged_attention",
                        lambda *a: calls.append(a) or real(*a))
    through_kernel = CpuKernelAttentionBackend().forward(q, empty, empty, k_cache, v_cache, meta, 0.125)
    assert len(calls) == 1
    monkeypatch.setattr("engine_core.attention.cpu_kernel_backend.paged_attention", lambda *a: False)
    meta.plan = None  # the next forward builds its own plan
    # the SDPA path attends to the chunk's own k and v when nothing is cached before it: hand them over
    k = torch.cat([k_cache.view(-1, 3, 64)[_slots(tables[i], 16, n)[n - ql:]] for i, (ql, n) in enumerate(seqs)])
    v = torch.cat([v_cache.view(-1, 3, 64)[_slots(tables[i], 16, n)[n - ql:]] for i, (ql, n) in enumerate(seqs)])
    meta.slot_mapping = torch.cat([_slots(tables[i], 16, n)[n - ql:] for i, (ql, n) in enumerate(seqs)])
    through_sdpa = CpuKernelAttentionBackend().forward(q, k, v, k_cache, v_cache, meta, 0.125)
    torch.testing.assert_close(through_kernel.float(), through_sdpa.float(), atol=2e-2, rtol=2e-2)
    assert not through_kernel.isnan().any()


def _slots(table, block_size, n):
    return (table.long()[:, None] * block_size + torch.arange(block_size)).flatten()[:n]


@needs_kernel
def test_float32_keeps_the_sdpa_path(monkeypatch):
    seqs = [(20, 20)]
    q, k_cache, v_cache, tables, seq_lens, starts = _case(4, 2, 64, 16, seqs)
    q, k_cache, v_cache = q.float(), k_cache.float(), v_cache.float()
    assert not paged_attention(q, k_cache, v_cache, tables, seq_lens, starts, 0.125, torch.empty_like(q))
    k = k_cache.view(-1, 2, 64)[_slots(tables[0], 16, 20)]
    meta = _meta(seqs, seq_lens, starts, tables, num_decodes=0)
    meta.slot_mapping = _slots(tables[0], 16, 20)
    out = TorchAttentionBackend().forward(q, k, k, k_cache, v_cache, meta, 0.125)
    assert out.dtype == torch.float32 and not out.isnan().any()


def test_kernel_declines_what_it_does_not_serve():
    q, k_cache, v_cache, tables, seq_lens, starts = _case(4, 2, 64, 16, [(5, 9), (2, 2)])
    out = torch.empty_like(q)
    assert not paged_attention(q, k_cache, v_cache, tables.long(), seq_lens, starts, 0.125, out)
    assert not paged_attention(q, k_cache, v_cache, tables, seq_lens, starts.long(), 0.125, out)
    if paged_avx512_bf16.load() is not None:  # shapes the C side declines: head_dim 48, group 16
        q48, k48, v48, t48, l48, s48 = _case(4, 2, 48, 16, [(3, 3)])
        assert not paged_attention(q48, k48, v48, t48, l48, s48, 0.125, torch.empty_like(q48))
        q16, k16, v16, t16, l16, s16 = _case(16, 1, 64, 16, [(3, 3)])
        assert not paged_attention(q16, k16, v16, t16, l16, s16, 0.125, torch.empty_like(q16))


def _unseen_blocks_to(tables, seq_lens, starts, block_size, window, block):
    """tables with every block no query row's window reaches pointed at `block`."""
    tables = tables.clone()
    for i, n in enumerate(seq_lens.tolist()):
        q_len = int(starts[i + 1] - starts[i])
        first_seen = max(0, n - q_len - window + 1)
        tables[i, : first_seen // block_size] = block
    return tables


@needs_kernel
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim,block_size", [(9, 3, 64, 16), (8, 2, 128, 5), (6, 2, 96, 32)])
def test_a_sliding_window_matches_the_reference_and_reads_no_key_before_it(num_heads, num_kv_heads, head_dim,
                                                                             block_size):
    """Windows inside a 16-key part, across parts and across 64-key tiles, over decodes, whole prompts and
    chunks after cached blocks; blocks no row's window reaches point at a NaN block."""
    seqs = [(1, 1), (1, 40), (1, 300), (33, 33), (5, 100), (64, 80), (31, 77), (200, 200)]
    q, k_cache, v_cache, tables, seq_lens, starts = _case(num_heads, num_kv_heads, head_dim, block_size, seqs)
    nan_block = next(b for b in range(k_cache.shape[0]) if k_cache[b].isnan().all())  # no table uses it
    for window in (5, 20, 70):
        out = torch.full_like(q, float("nan"))
        unseen = _unseen_blocks_to(tables, seq_lens, starts, block_size, window, nan_block)
        assert paged_attention(q, k_cache, v_cache, unseen, seq_lens, starts, head_dim**-0.5, out, window)
        expected = reference_paged_attention(q, k_cache, v_cache, starts, seq_lens, tables, head_dim**-0.5, window)
        torch.testing.assert_close(out.float(), expected.float(), atol=2e-2, rtol=2e-2)


@needs_kernel
def test_a_windowed_row_is_bit_identical_however_it_is_chunked():
    length, window = 300, 70
    q, k_cache, v_cache, tables, seq_lens, _ = _case(9, 3, 64, 16, [(length, length)], seed=2)

    def run(rows, seq_len, q_rows):
        out = torch.empty_like(q_rows)
        assert paged_attention(q_rows, k_cache, v_cache, tables, torch.tensor([seq_len], dtype=torch.int32),
                               torch.tensor([0, rows], dtype=torch.int32), 0.125, out, window)
        return out

    whole = run(length, length, q)
    for p in [0, 15, 63, 64, 69, 70, 71, 100, 133, 134, 135, 200, 299]:
        assert torch.equal(whole[p], run(1, p + 1, q[p:p + 1])[0]), p
        for chunk in [7, 33, 64]:
            if chunk <= p + 1:
                assert torch.equal(whole[p], run(chunk, p + 1, q[p + 1 - chunk:p + 1])[-1]), (p, chunk)
