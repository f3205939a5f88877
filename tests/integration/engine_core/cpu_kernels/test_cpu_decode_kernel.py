"""The CPU decode-attention kernel (C, AVX512-BF16) against the plain reference, and its fallbacks."""

import pytest
import torch

from tests.support.attention_reference import reference_paged_attention
from engine_core.platform import batch_invariance
from engine_core.cpu_kernels.attention import paged_avx512_bf16
from engine_core.cpu_kernels.attention.paged_avx512_bf16 import paged_attention, paged_decode_attention
from engine_core.attention.cpu_kernel_backend import CpuKernelAttentionBackend
from engine_core.attention.metadata import AttentionMetadata

pytestmark = pytest.mark.integration

needs_kernel = pytest.mark.skipif(paged_avx512_bf16.load() is None,
                                  reason="needs a CPU with AVX512-BF16 and a C compiler (the kernel is not built here)")


def _case(num_heads, num_kv_heads, head_dim, block_size, lens, seed=0):
    g = torch.Generator().manual_seed(seed)
    num_blocks = sum(-(-n // block_size) for n in lens) + 8
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=g).to(torch.bfloat16)
    v_cache = torch.randn(shape, generator=g).to(torch.bfloat16)
    width = max(-(-n // block_size) for n in lens)
    order = torch.randperm(num_blocks, generator=g)  # blocks scattered over the pool, as in a served cache
    tables = torch.zeros(len(lens), width + 3, dtype=torch.int32)  # wider than needed, as tables are padded
    used = 0
    for i, n in enumerate(lens):
        count = -(-n // block_size)
        tables[i, :count] = order[used:used + count]
        used += count
    q = (torch.randn(len(lens), num_heads, head_dim, generator=g) * 2).to(torch.bfloat16)
    return q, k_cache, v_cache, tables, torch.tensor(lens, dtype=torch.int32)


@needs_kernel
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim,block_size", [
    (9, 3, 64, 16),  # SmolLM2's shape
    (4, 4, 64, 1), (8, 2, 128, 4), (16, 4, 64, 32), (16, 8, 128, 16),  # group sizes 1, 4, 4 and 2
    (12, 2, 64, 16), (6, 2, 96, 8),  # group 6 and head dim 96: the general (not specialised) instance
])
def test_kernel_matches_reference(num_heads, num_kv_heads, head_dim, block_size):
    lens = [1, 15, 16, 17, 33, 300, 2 * block_size + 1]
    q, k_cache, v_cache, tables, seq_lens = _case(num_heads, num_kv_heads, head_dim, block_size, lens)
    out = torch.full_like(q, float("nan"))
    assert paged_decode_attention(q, k_cache, v_cache, tables, seq_lens, head_dim**-0.5, out)
    expected = reference_paged_attention(q, k_cache, v_cache, list(range(len(lens) + 1)), seq_lens, tables,
                                         head_dim**-0.5)
    # bfloat16 inputs, probabilities and output: a few units in the last place of bf16
    torch.testing.assert_close(out.float(), expected.float(), atol=2e-2, rtol=2e-2)


@needs_kernel
def test_a_sequence_result_does_not_depend_on_the_batch_or_the_work_split():
    """Many sequences are split one per work item (all KV heads), a few one KV head per item: the
    same sequence gives the same bits either way, alone or in a batch, on one thread or two."""
    lens = [5, 300, 77, 16, 129, 1000, 3, 64]
    q, k_cache, v_cache, tables, seq_lens = _case(9, 3, 64, 16, lens, seed=3)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        batch = torch.empty_like(q)
        assert paged_decode_attention(q, k_cache, v_cache, tables, seq_lens, 0.125, batch)  # whole sequences
        for threads_now in (1, 2):
            torch.set_num_threads(threads_now)
            for i in range(len(lens)):
                alone = torch.empty_like(q[i:i + 1])  # one head per item on two threads, all heads on one
                assert paged_decode_attention(q[i:i + 1], k_cache, v_cache, tables[i:i + 1], seq_lens[i:i + 1],
                                              0.125, alone)
                assert torch.equal(alone[0], batch[i])
    finally:
        torch.set_num_threads(threads)


def _decode_step(lens):
    """A step of one-token sequences of these lengths, already in the cache: its tensors, metadata and empty k/v."""
    q, k_cache, v_cache, tables, seq_lens = _case(9, 3, 64, 16, lens, seed=1)
    meta = AttentionMetadata(slot_mapping=torch.empty(0, dtype=torch.int64),
                             query_start_loc=torch.arange(len(lens) + 1, dtype=torch.int32), seq_lens=seq_lens,
                             block_tables=tables, max_query_len=1, max_seq_len=max(lens), num_decodes=len(lens),
                             query_start_loc_cpu=list(range(len(lens) + 1)), seq_lens_cpu=lens)
    return q, k_cache, v_cache, tables, seq_lens, meta, torch.empty(0, 3, 64, dtype=torch.bfloat16)


@needs_kernel
def test_backend_decodes_through_the_kernel_and_equal_sdpa(monkeypatch):
    """With --no-batch-invariant the CPU kernel backend's decode rows come from the decode kernel, and
    equal its SDPA path to bf16 rounding."""
    batch_invariance.set_batch_invariant(False)
    q, k_cache, v_cache, tables, seq_lens, meta, empty = _decode_step([40, 7, 129])
    calls = []
    real = paged_decode_attention
    monkeypatch.setattr("engine_core.attention.cpu_kernel_backend.paged_decode_attention",
                        lambda *a: calls.append(1) or real(*a))
    through_kernel = CpuKernelAttentionBackend().forward(q, empty, empty, k_cache, v_cache, meta, 0.125)
    assert calls
    monkeypatch.setattr("engine_core.attention.cpu_kernel_backend.paged_decode_attention", lambda *a: False)
    meta.plan = None  # the next forward builds its own plan
    through_sdpa = CpuKernelAttentionBackend().forward(q, empty, empty, k_cache, v_cache, meta, 0.125)
    torch.testing.assert_close(through_kernel.float(), through_sdpa.float(), atol=2e-2, rtol=2e-2)


@needs_kernel
def test_batch_invariant_decodes_go_through_the_chunk_kernel(monkeypatch):
    """The default: one-token rows take the chunk kernel, as the same tokens do inside prefill chunks."""
    q, k_cache, v_cache, tables, seq_lens, meta, empty = _decode_step([40, 7, 129])
    monkeypatch.setattr("engine_core.attention.cpu_kernel_backend.paged_decode_attention",
                        lambda *a: pytest.fail("the decode kernel ran in a batch-invariant step"))
    out = CpuKernelAttentionBackend().forward(q, empty, empty, k_cache, v_cache, meta, 0.125)
    chunk = torch.empty_like(q)
    assert paged_attention(q, k_cache, v_cache, tables, seq_lens, meta.query_start_loc, 0.125, chunk)
    assert torch.equal(out, chunk)


def test_kernel_declines_what_it_does_not_serve():
    q, k_cache, v_cache, tables, seq_lens = _case(4, 2, 64, 16, [5, 9])
    out = torch.empty(2, 4, 64)
    assert not paged_decode_attention(q.float(), k_cache.float(), v_cache.float(), tables, seq_lens, 0.125, out)
    assert not paged_decode_attention(q, k_cache, v_cache, tables.long(), seq_lens, 0.125, out.bfloat16())


@needs_kernel
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim,block_size", [(9, 3, 64, 16), (8, 2, 128, 4), (6, 2, 96, 8)])
def test_a_sliding_window_matches_the_reference_and_reads_no_key_before_it(num_heads, num_kv_heads, head_dim,
                                                                             block_size):
    lens = [1, 15, 16, 17, 33, 300, 2 * block_size + 1]
    q, k_cache, v_cache, tables, seq_lens = _case(num_heads, num_kv_heads, head_dim, block_size, lens)
    used = {int(tables[i, j]) for i, n in enumerate(lens) for j in range(-(-n // block_size))}
    nan_block = min(set(range(k_cache.shape[0])) - used)  # no table uses it
    k_cache[nan_block] = v_cache[nan_block] = float("nan")
    for window in (5, 16, 40):
        unseen = tables.clone()
        for i, n in enumerate(lens):  # blocks wholly before the decode's window: NaN, never to be read
            unseen[i, : max(0, n - window) // block_size] = nan_block
        out = torch.full_like(q, float("nan"))
        assert paged_decode_attention(q, k_cache, v_cache, unseen, seq_lens, head_dim**-0.5, out, window)
        expected = reference_paged_attention(q, k_cache, v_cache, list(range(len(lens) + 1)), seq_lens, tables,
                                             head_dim**-0.5, window)
        torch.testing.assert_close(out.float(), expected.float(), atol=2e-2, rtol=2e-2)
