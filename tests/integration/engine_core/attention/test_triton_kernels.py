"""The Triton paged-KV kernels against the plain torch reference.

Without CUDA the kernels run in the Triton interpreter, which needs TRITON_INTERPRET=1 set before
triton is first imported in the process: Triton reads the variable when `@triton.jit` decorates a
function, and triton.language decorates its own helpers (tl.zeros, the reduction combiners) when it
is imported, so a late setting leaves a mix that cannot run. This module sets it at the top. If
another test module of the same pytest process imported triton earlier without it (torch.compile,
say), the in-process tests skip themselves and test_kernels_in_fresh_process reruns this file in a
subprocess with the variable set from the start. That is robust whatever the import order is.
"""

import os
import random
import subprocess
import sys
from xml.etree import ElementTree

import pytest
import torch

pytestmark = pytest.mark.integration

CUDA = torch.cuda.is_available()
TRITON_IMPORTED_LATE = not CUDA and "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1"
if not CUDA:
    os.environ["TRITON_INTERPRET"] = "1"

pytest.importorskip("triton", reason="triton is not installed, so there are no Triton kernels to test")

from engine_core.platform import batch_invariance  # noqa: E402
from engine_core.attention import triton_kernels, triton_tiles  # noqa: E402
from engine_core.attention.metadata import AttentionMetadata  # noqa: E402
from tests.support.attention_reference import reference_paged_attention  # noqa: E402
from tests.support.paged_attention_scenarios import Piece, Sequences, run_batch, scenarios  # noqa: E402
from tests.support.paths import ROOT  # noqa: E402

IN_PROCESS = CUDA or (not TRITON_IMPORTED_LATE and triton_kernels._INTERPRETED)


@pytest.fixture(autouse=True)
def _kernels_runnable_here(request):
    if not IN_PROCESS and request.node.originalname != "test_kernels_in_fresh_process":
        pytest.skip("triton was imported before TRITON_INTERPRET=1; test_kernels_in_fresh_process runs this")


def test_kernels_in_fresh_process(tmp_path):
    if IN_PROCESS:
        pytest.skip("the kernels run in this process")
    repo = ROOT
    env = dict(os.environ, TRITON_INTERPRET="1")
    report = tmp_path / "inner.xml"
    proc = subprocess.run([sys.executable, "-m", "pytest", os.path.abspath(__file__), "-q", "-x", "-rs",
                           "-p", "no:cacheprovider", f"--junitxml={report}"], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=600)
    output = proc.stdout[-6000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, output
    # exit code 0 also means "everything skipped": count the kernel tests that really ran and passed
    cases = ElementTree.parse(report).getroot().iter("testcase")
    passed = [c.get("name") for c in cases if not any(k.tag in ("skipped", "failure", "error") for k in c)]
    assert passed, f"the fresh process ran no kernel test (all skipped or none collected):\n{output}"


DEVICE = "cuda" if CUDA else "cpu"
TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.bfloat16: dict(atol=1e-2, rtol=1e-2),
       torch.float16: dict(atol=2e-3, rtol=2e-3)}

# (seq_len, query_len), decodes first: decodes at a block edge, short and long; then a fresh prefill,
# prefill chunks after a cached prefix (aligned and not), a one-token-context chunk
MIXED = [(37, 1), (16, 1), (1, 1), (80, 1), (23, 23), (80, 29), (48, 16), (9, 8)]
DECODES = [(37, 1), (16, 1), (1, 1), (80, 1), (33, 1)]


def make_batch(seqs, block_size, num_kv_heads, group, head_dim, dtype, seed=0, spare_blocks=3):
    """Random q and caches, block tables drawn from a shuffled pool (non-contiguous ids, padded
    with 0). Returns q, k_cache, v_cache, query_start_loc, seq_lens, block_tables, slot_mapping."""
    gen = torch.Generator().manual_seed(seed)
    need = [-(-s // block_size) for s, _ in seqs]
    num_blocks = sum(need) + spare_blocks
    pool = torch.randperm(num_blocks, generator=gen).tolist()
    tables = torch.zeros(len(seqs), max(need), dtype=torch.int32)
    for i, n in enumerate(need):
        tables[i, :n] = torch.tensor([pool.pop() for _ in range(n)], dtype=torch.int32)
    starts = [0]
    slots = []
    for i, (s, ql) in enumerate(seqs):
        starts.append(starts[-1] + ql)
        slots += [int(tables[i, p // block_size]) * block_size + p % block_size for p in range(s - ql, s)]
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(dtype)
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    q = torch.randn(starts[-1], num_kv_heads * group, head_dim, generator=gen).to(dtype)
    to = lambda x: x.to(DEVICE)  # noqa: E731
    return (to(q), to(k_cache), to(v_cache), to(torch.tensor(starts, dtype=torch.int32)),
            to(torch.tensor([s for s, _ in seqs], dtype=torch.int32)), to(tables),
            to(torch.tensor(slots, dtype=torch.int64)))


def check_attention(seqs, block_size, num_kv_heads, group, head_dim, dtype, seed=0):
    q, kc, vc, qsl, lens, tables, _ = make_batch(seqs, block_size, num_kv_heads, group, head_dim, dtype, seed)
    scale = head_dim ** -0.5
    out = triton_kernels.paged_attention(q, kc, vc, qsl, lens, tables, scale,
                                         max(ql for _, ql in seqs), max(s for s, _ in seqs))
    assert out.shape == q.shape and out.dtype == dtype
    # the reference on exactly upcast inputs, in fp32: the kernel's only extra error is its own rounding
    ref = reference_paged_attention(q.float(), kc.float(), vc.float(), qsl, lens, tables, scale)
    torch.testing.assert_close(out.float(), ref, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 3, 4])
def test_mixed_batch(group, head_dim, dtype):
    check_attention(MIXED, 16, 2, group, head_dim, dtype)


@pytest.mark.parametrize("block_size,group,head_dim,dtype", [
    (8, 4, 64, torch.bfloat16),
    (32, 3, 128, torch.float32),
    (1, 2, 64, torch.float32),
    (32, 1, 64, torch.float16),
    (256, 2, 128, torch.bfloat16),  # the block size flash-attn's paged kernels need
])
def test_other_block_sizes(block_size, group, head_dim, dtype):
    check_attention(MIXED, block_size, 2, group, head_dim, dtype, seed=1)


@pytest.mark.parametrize("group,dtype", [(1, torch.float32), (3, torch.bfloat16), (4, torch.bfloat16)])
def test_decode_only(group, dtype):
    """max_query_len == 1 takes the decode tiling (all query heads of a kv head in one program)."""
    check_attention(DECODES, 16, 2, group, 64, dtype, seed=2)


def test_prefill_only_and_single_sequence():
    check_attention([(70, 70)], 16, 1, 4, 64, torch.float32, seed=3)
    check_attention([(75, 40), (17, 17)], 16, 3, 1, 64, torch.bfloat16, seed=4)


def test_head_dim_not_power_of_two():
    check_attention([(20, 1), (50, 12)], 16, 2, 2, 80, torch.float32, seed=5)


def test_strided_query_and_empty_sequence():
    """q as a view into a fused qkv tensor (row stride > H * D), and a trailing sequence with no
    query tokens (as padding may leave): it must not disturb the others."""
    seqs = [(30, 1), (40, 13), (0, 0)]
    q, kc, vc, qsl, lens, tables, _ = make_batch(seqs, 16, 2, 3, 64, torch.float32, seed=6)
    T, H, D = q.shape
    qkv = torch.randn(T, (H + 4) * D, device=DEVICE)
    qkv[:, :H * D] = q.reshape(T, H * D)
    q_view = qkv[:, :H * D].view(T, H, D)
    assert not q_view.is_contiguous()
    out = triton_kernels.paged_attention(q_view, kc, vc, qsl, lens, tables, 0.125, 13, 40)
    ref = reference_paged_attention(q, kc, vc, qsl, lens, tables, 0.125)
    torch.testing.assert_close(out, ref, **TOL[torch.float32])


def test_writes_into_given_out():
    q, kc, vc, qsl, lens, tables, _ = make_batch([(12, 1), (20, 5)], 8, 2, 2, 64, torch.float32, seed=7)
    out = torch.full_like(q, float("nan"))
    res = triton_kernels.paged_attention(q, kc, vc, qsl, lens, tables, 0.125, 5, 20, out=out)
    assert res is out
    torch.testing.assert_close(out, reference_paged_attention(q, kc, vc, qsl, lens, tables, 0.125),
                               **TOL[torch.float32])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("block_size,num_kv_heads,head_dim", [(16, 3, 64), (8, 2, 128)])
def test_store_kvcache_writes_exactly_its_slots(block_size, num_kv_heads, head_dim, dtype):
    gen = torch.Generator().manual_seed(8)
    num_blocks, T = 6, 20
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(dtype).to(DEVICE)
    v_cache = torch.randn(shape, generator=gen).to(dtype).to(DEVICE)
    k = torch.randn(T, num_kv_heads, head_dim, generator=gen).to(dtype).to(DEVICE)
    v = torch.randn(T, num_kv_heads, head_dim, generator=gen).to(dtype).to(DEVICE)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:T]
    slots[[3, 11, 19]] = -1  # padding tokens: skipped
    slots = slots.to(DEVICE)
    want_k, want_v = k_cache.clone(), v_cache.clone()
    keep = slots >= 0
    want_k.view(-1, num_kv_heads, head_dim)[slots[keep]] = k[keep]
    want_v.view(-1, num_kv_heads, head_dim)[slots[keep]] = v[keep]
    triton_kernels.store_kvcache(k, v, k_cache, v_cache, slots)
    assert torch.equal(k_cache, want_k)
    assert torch.equal(v_cache, want_v)


def test_backend_forward_stores_then_attends():
    """The backend end to end: caches hold only the prefixes; the new tokens' k/v go in first."""
    from engine_core.attention.triton_backend import TritonAttentionBackend

    seqs = [(25, 1), (40, 1), (33, 33), (60, 20)]
    block_size, num_kv_heads, group, head_dim = 16, 2, 3, 64
    q, kc, vc, qsl, lens, tables, slots = make_batch(seqs, block_size, num_kv_heads, group, head_dim,
                                                     torch.bfloat16, seed=9)
    full_k, full_v = kc.clone(), vc.clone()
    new_k = full_k.view(-1, num_kv_heads, head_dim)[slots].clone()
    new_v = full_v.view(-1, num_kv_heads, head_dim)[slots].clone()
    kc.view(-1, num_kv_heads, head_dim)[slots] = 0  # the new tokens are not cached yet
    vc.view(-1, num_kv_heads, head_dim)[slots] = 0
    starts = qsl.tolist()
    meta = AttentionMetadata(slot_mapping=slots, query_start_loc=qsl, seq_lens=lens, block_tables=tables,
                             max_query_len=33, max_seq_len=60, num_decodes=2, query_start_loc_cpu=starts,
                             seq_lens_cpu=lens.tolist())
    backend = TritonAttentionBackend()
    assert backend.name == "triton"
    out = backend.forward(q, new_k, new_v, kc, vc, meta, head_dim ** -0.5)
    assert torch.equal(kc, full_k) and torch.equal(vc, full_v)
    ref = reference_paged_attention(q.float(), full_k.float(), full_v.float(), qsl, lens, tables, head_dim ** -0.5)
    torch.testing.assert_close(out.float(), ref, **TOL[torch.bfloat16])


def test_reference_matches_dense_causal_attention():
    """The reference itself, on a contiguous one-sequence cache, against SDPA."""
    gen = torch.Generator().manual_seed(10)
    S, Hkv, group, D, bs = 24, 2, 2, 16, 8
    k = torch.randn(S, Hkv, D, generator=gen)
    v = torch.randn(S, Hkv, D, generator=gen)
    q = torch.randn(S, Hkv * group, D, generator=gen)
    kc, vc = k.view(S // bs, bs, Hkv, D), v.view(S // bs, bs, Hkv, D)
    tables = torch.arange(S // bs, dtype=torch.int32)[None]
    ref = reference_paged_attention(q[-5:], kc, vc, [0, 5], [S], tables, 0.3)
    dense = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1).repeat_interleave(group, 0), v.transpose(0, 1).repeat_interleave(group, 0),
        is_causal=True, scale=0.3).transpose(0, 1)
    torch.testing.assert_close(ref, dense[-5:], atol=1e-5, rtol=1e-5)


@pytest.fixture
def invariant_switch():
    """Sets the process-wide batch-invariance switch for one test and puts it back after."""
    was = batch_invariance.batch_invariant()
    yield batch_invariance.set_batch_invariant
    batch_invariance.set_batch_invariant(was)


def _bits(x: torch.Tensor) -> torch.Tensor:
    """x's storage as integers: equal bits, not merely equal values (-0.0 is not 0.0, NaN is NaN)."""
    return x.view({4: torch.int32, 2: torch.int16}[x.element_size()])


def assert_rows_invariant(lengths, num_kv_heads, group, head_dim, dtype, block_size=16, seed=0, chunk_sizes=(3, 16)):
    """Every row of `lengths`' sequences computed in every way of paged_attention_scenarios is the
    same bits; and the rows match the fp32 reference."""
    rng = random.Random(seed)
    seqs = Sequences(lengths, num_kv_heads, group, head_dim, dtype, seed=seed)
    scale = head_dim ** -0.5

    def kernel(q, kc, vc, qsl, lens, tables, max_query_len, max_seq_len):
        return triton_kernels.paged_attention(q, kc, vc, qsl, lens, tables, scale, max_query_len, max_seq_len)

    def reference(q, kc, vc, qsl, lens, tables, max_query_len, max_seq_len):
        return reference_paged_attention(q.float(), kc.float(), vc.float(), qsl, lens, tables, scale)

    first = {}  # row -> (how it was first computed, its output)
    for how, batches in scenarios(lengths, rng, chunk_sizes).items():
        for batch in batches:
            for row, out in run_batch(seqs, batch, kernel, block_size, rng, DEVICE):
                was_how, was = first.setdefault(row, (how, out))
                if not torch.equal(_bits(out), _bits(was)):
                    pytest.fail(f"row {row} (lengths {lengths}): computed as '{how}' differs from '{was_how}' "
                                f"by up to {(out.float() - was.float()).abs().max().item():.3g}")
    assert sorted(first) == seqs.rows()
    for s, n in enumerate(lengths):
        want = torch.stack([out for _, out in run_batch(seqs, [Piece(s, 0, n)], reference, block_size, rng, DEVICE)])
        got = torch.stack([first[(s, p)][1] for p in range(n)])
        torch.testing.assert_close(got.float(), want, **TOL[dtype])


@pytest.mark.parametrize("dtype,num_kv_heads,group", [(torch.float32, 2, 1), (torch.bfloat16, 1, 3),
                                                      (torch.float16, 1, 2)], ids=["fp32", "bf16", "fp16"])
def test_row_is_the_same_bits_however_it_is_batched(dtype, num_kv_heads, group, invariant_switch):
    """Batch invariance: one long sequence (two or more key tiles in every dtype) and three of random
    lengths; each row as a decode, in chunks, after a cached prefix, in mixed batches."""
    invariant_switch(True)
    rng = random.Random(str(dtype))
    lengths = [rng.randrange(66, 90)] + [rng.randrange(1, 66) for _ in range(3)]
    assert_rows_invariant(lengths, num_kv_heads, group, 64, dtype, seed=len(str(dtype)))


def test_each_mode_launches_its_own_tiling(monkeypatch, invariant_switch):
    """What the interpreter cannot show (its dots are numpy sums of fixed order, so either tiling
    gives a row the same bits there): invariant mode launches one tiling for decode-only and mixed
    steps; off, a decode-only step takes the smaller decode tile, a separately compiled kernel on a GPU."""
    launches = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **constexprs: launches.append(constexprs)

    monkeypatch.setattr(triton_kernels, "_paged_attention_kernel", Recorder())
    q, kc, vc, qsl, lens, tables, _ = make_batch(DECODES, 16, 2, 4, 64, torch.bfloat16)
    mq, mk, mv, mqsl, mlens, mtables, _ = make_batch(MIXED, 16, 2, 4, 64, torch.bfloat16)
    tiling = lambda c: (c["BLOCK_M"], c["BLOCK_N"], c["num_warps"])  # noqa: E731
    for on in (True, False):
        invariant_switch(on)
        launches.clear()
        triton_kernels.paged_attention(q, kc, vc, qsl, lens, tables, 0.125, 1, 80)
        triton_kernels.paged_attention(mq, mk, mv, mqsl, mlens, mtables, 0.125, 29, 80)
        decode, mixed = launches
        assert decode["INVARIANT"] is mixed["INVARIANT"] is on
        assert tiling(mixed) == triton_tiles.invariant_tiles(4, 64, 2)
        assert (tiling(decode) == tiling(mixed)) is on
    assert tiling(decode) == triton_tiles.shape_tuned_tiles(4, 64, 2, max_query_len=1) == (16, 64, 4)


@pytest.mark.parametrize("group,head_dim,elem_size", [(1, 64, 4), (4, 128, 2), (8, 128, 2), (3, 80, 4),
                                                      (32, 256, 2)])
def test_invariant_tiling_ignores_the_step(group, head_dim, elem_size):
    tiles = triton_tiles.invariant_tiles(group, head_dim, elem_size)
    assert tiles.block_m >= group and tiles.block_m >= 64 and tiles.block_m & (tiles.block_m - 1) == 0
    assert triton_tiles.shape_tuned_tiles(group, head_dim, elem_size, max_query_len=7) == tiles
    assert triton_tiles.shape_tuned_tiles(group, head_dim, elem_size, max_query_len=1).block_n == tiles.block_n


@pytest.mark.skipif(not CUDA, reason="needs a GPU (large shapes are too slow in the interpreter)")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("group,head_dim", [(4, 128), (3, 64), (8, 128)])
def test_large_mixed_batch_gpu(group, head_dim, dtype):
    gen = torch.Generator().manual_seed(11)
    decodes = [(int(s), 1) for s in torch.randint(1, 3000, (48,), generator=gen)]
    prefills = [(1000, 1000), (2500, 700), (4097, 513), (300, 299), (64, 64)]
    check_attention(decodes + prefills, 16, 8, group, head_dim, dtype, seed=12)
    check_attention(decodes, 32, 8, group, head_dim, dtype, seed=13)


@pytest.mark.skipif(not CUDA, reason="needs a GPU (large shapes are too slow in the interpreter)")
@pytest.mark.parametrize("dtype,group,head_dim", [(torch.bfloat16, 4, 128), (torch.float16, 8, 128),
                                                  (torch.float32, 2, 64), (torch.bfloat16, 1, 256)])
def test_row_is_the_same_bits_however_it_is_batched_gpu(dtype, group, head_dim, invariant_switch):
    """On a GPU a tiling is a compiled kernel of its own (MMA shape, reduction layout): long sequences,
    many key tiles, chunks of every common size."""
    invariant_switch(True)
    rng = random.Random(f"{dtype}{group}")
    lengths = [rng.randrange(300, 1100) for _ in range(2)] + [rng.randrange(1, 300) for _ in range(3)]
    assert_rows_invariant(lengths, 2, group, head_dim, dtype, seed=group, chunk_sizes=(3, 16, 61, 256))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_a_sliding_window_matches_the_reference_and_loads_no_key_before_it(dtype):
    """Windows inside a key tile and across tiles, over decodes, a fresh prefill and chunks after cached blocks;
    blocks no row's window reaches point at a NaN block, which would show in any row that loaded it."""
    block_size, num_kv_heads, group, head_dim = 8, 2, 3, 64
    q, kc, vc, qsl, lens, tables, _ = make_batch(MIXED, block_size, num_kv_heads, group, head_dim, dtype, seed=11)
    used = set(tables.flatten().tolist())
    nan_block = min(set(range(kc.shape[0])) - used)
    kc[nan_block] = vc[nan_block] = float("nan")
    starts = qsl.tolist()
    for window in (5, 21):
        unseen = tables.clone()
        for i, (seq_len, q_len) in enumerate(MIXED):
            unseen[i, : max(0, seq_len - q_len - window + 1) // block_size] = nan_block
        out = triton_kernels.paged_attention(q, kc, vc, qsl, lens, unseen, head_dim ** -0.5,
                                             max(ql for _, ql in MIXED), max(s for s, _ in MIXED), window=window)
        ref = reference_paged_attention(q.float(), kc.float(), vc.float(), starts, lens, tables, head_dim ** -0.5,
                                        window)
        torch.testing.assert_close(out.float(), ref, **TOL[dtype])


def test_a_windowed_row_is_the_same_bits_however_it_is_chunked():
    seq_len, window, block_size, num_kv_heads, group, head_dim = 40, 11, 8, 2, 2, 32
    q, kc, vc, _, _, tables, _ = make_batch([(seq_len, seq_len)], block_size, num_kv_heads, group, head_dim,
                                            torch.float32, seed=12)

    def run(rows, length):  # the last `rows` tokens of the first `length`, after the ones before them
        qsl = torch.tensor([0, rows], dtype=torch.int32, device=DEVICE)
        lens = torch.tensor([length], dtype=torch.int32, device=DEVICE)
        return triton_kernels.paged_attention(q[length - rows:length], kc, vc, qsl, lens, tables, 0.2, rows, length,
                                              invariant=True, window=window)

    whole = run(seq_len, seq_len)
    for p in (0, 10, 11, 12, 31, 32, 33, 39):
        assert torch.equal(_bits(run(1, p + 1)[0]), _bits(whole[p])), p
    assert torch.equal(_bits(torch.cat([run(17, 17), run(23, 40)])), _bits(whole))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_soft_capped_scores_match_the_reference(dtype):
    """Gemma 2's attn_logit_softcapping (cap * tanh(s / cap), before the mask) with and without a window, caps
    that bind on these scores (the uncapped reference is far off); fp32 rows the same bits however chunked."""
    block_size, num_kv_heads, group, head_dim, scale = 8, 2, 3, 64, 0.4
    q, kc, vc, qsl, lens, tables, _ = make_batch(MIXED, block_size, num_kv_heads, group, head_dim, dtype, seed=13)
    starts = qsl.tolist()
    for softcap, window in ((2.0, None), (0.5, 21)):
        out = triton_kernels.paged_attention(q, kc, vc, qsl, lens, tables, scale, max(ql for _, ql in MIXED),
                                             max(s for s, _ in MIXED), window=window, softcap=softcap)
        ref = reference_paged_attention(q.float(), kc.float(), vc.float(), starts, lens, tables, scale, window,
                                        softcap)
        uncapped = reference_paged_attention(q.float(), kc.float(), vc.float(), starts, lens, tables, scale, window)
        torch.testing.assert_close(out.float(), ref, **TOL[dtype])
        assert not torch.allclose(out.float(), uncapped, atol=1e-2, rtol=1e-2)


def test_a_capped_row_is_the_same_bits_however_it_is_chunked():
    seq_len, block_size, num_kv_heads, group, head_dim = 40, 8, 2, 2, 32
    q, kc, vc, _, _, tables, _ = make_batch([(seq_len, seq_len)], block_size, num_kv_heads, group, head_dim,
                                            torch.float32, seed=14)

    def run(rows, length):
        qsl = torch.tensor([0, rows], dtype=torch.int32, device=DEVICE)
        lens = torch.tensor([length], dtype=torch.int32, device=DEVICE)
        return triton_kernels.paged_attention(q[length - rows:length], kc, vc, qsl, lens, tables, 0.5, rows, length,
                                              invariant=True, softcap=2.0)

    whole = run(seq_len, seq_len)
    for p in (0, 15, 16, 31, 39):
        assert torch.equal(_bits(run(1, p + 1)[0]), _bits(whole[p])), p
    assert torch.equal(_bits(torch.cat([run(17, 17), run(23, 40)])), _bits(whole))
