"""Quantized linear kernels (quant_bf16_dot.c) against a plain dequantize-then-matmul reference: every GGUF
format they take and per-channel int8, shapes with column and row tails, the paths (small M on the
quantized integers; large M batch-invariant, the same arithmetic through unpacked slabs, or with
--no-batch-invariant through bf16 panels), the gated gate/up form, and a row's result independent of
the other rows and the thread count (at every M when batch-invariant, within a path otherwise)."""

import pytest
import torch

from engine_core.cpu_kernels import table
from engine_core.cpu_kernels.linear import dense_linear, quant_bf16_dot
from engine_core.cpu_kernels.ops import fused_ops
from tests.support.gguf_weights import quantized_weight

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True, scope="module")
def _cpu_quant_itself():
    """quant_bf16_dot.c, where the amx tier would serve amx_quant.c (test_amx_quant.py) or quant_vnni.c
    (test_quant_vnni.py) in its place."""
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("NVLLM_CPU_QUANT_VNNI", raising=False)
        patch.setenv("NVLLM_CPU_AMX_QUANT", "0")
        table.forget()
        yield
    table.forget()

needs_kernel = pytest.mark.skipif(quant_bf16_dot.load() is None,
                                  reason="needs AVX512-BF16 (with AMX: batch invariance on): quant_bf16_dot.c does not run here")

LARGE_M = 16  # quant_bf16_dot.c's QUANT_LARGE_M
FORMATS = ["q4_0", "q4_1", "q8_0"]


def _quantized(qtype: str, n: int, k: int, seed: int) -> tuple[quant_bf16_dot.QuantizedTensor, torch.Tensor]:
    """A random [n, k] weight quantized by gguf-py, and its dequantized float32 values."""
    return quantized_weight(qtype, n, k, seed)


def _x(m: int, k: int, seed: int) -> torch.Tensor:
    return torch.randn(m, k, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


@needs_kernel
@pytest.mark.parametrize("qtype", FORMATS)
@pytest.mark.parametrize("n,k", [(1, 32), (15, 64), (17, 96), (100, 576), (1000, 64)])
def test_small_m_matches_the_dequantized_product(qtype, n, k):
    weight, dequantized = _quantized(qtype, n, k, seed=n + k)
    packed = quant_bf16_dot.QuantPanelWeight(weight)
    for m in (1, 2, 3, 4, 5, 9, LARGE_M - 1):
        x = _x(m, k, seed=m)
        got = packed.matmul(x).double()
        exact = x.double() @ dequantized.double().T
        # one bf16 rounding of an fp32 sum whose terms are exact (the weights are not rounded to bf16)
        scale = x.double().abs() @ dequantized.double().abs().T
        assert torch.all((got - exact).abs() <= exact.abs() * 2**-8 + scale * 2**-16), (qtype, m, n, k)


@needs_kernel
@pytest.mark.parametrize("qtype", FORMATS)
def test_small_m_reads_every_weight_where_it_belongs(qtype):
    """Unit inputs pick single weights, which come out exactly (d q + m rounded once): a misplaced nibble
    or byte cannot hide in a sum."""
    n, k = 40, 96
    weight, dequantized = _quantized(qtype, n, k, seed=7)
    packed = quant_bf16_dot.QuantPanelWeight(weight)
    eye = torch.eye(k, dtype=torch.bfloat16)
    for first in range(0, k, 4):
        got = packed.matmul(eye[first:first + 4])
        assert torch.equal(got, dequantized[:, first:first + 4].T.to(torch.bfloat16)), first


@needs_kernel
@pytest.mark.parametrize("qtype", FORMATS)
@pytest.mark.parametrize("n,k", [(15, 64), (100, 576), (1000, 96)])
def test_large_m_is_the_bf16_kernel_on_the_dequantized_weights(qtype, n, k, not_invariant):
    if dense_linear.load() is None:
        pytest.skip("shape-tuned runs on an AMX CPU take oneDNN's AMX kernels, not dense_bf16_dot.c or quant_bf16_dot.c")
    weight, dequantized = _quantized(qtype, n, k, seed=3 * n + k)
    quantized, bf16 = quant_bf16_dot.QuantPanelWeight(weight), dense_linear.PanelWeight(dequantized.to(torch.bfloat16))
    bias = _x(1, n, seed=5)[0]
    for m in (LARGE_M, 17, 64, 301):
        x = _x(m, k, seed=m)
        assert torch.equal(quantized.matmul(x, bias), bf16.matmul(x, bias)), (qtype, m)


@needs_kernel
@pytest.mark.parametrize("qtype", FORMATS)
@pytest.mark.parametrize("gated", [False, True])
def test_batch_invariant_rows_equal_the_row_alone_at_every_m(qtype, gated):
    """The default: a row's bits are those it gets alone (M = 1), whatever M, its place and the threads."""
    n, k = (256, 576) if gated else (200, 1536)
    weight, _ = _quantized(qtype, n, k, seed=21)
    packed = (quant_bf16_dot.GatedQuantPanelWeight(weight, fused_ops.silu_table()) if gated
              else quant_bf16_dot.QuantPanelWeight(weight))
    run = packed.silu_and_mul if gated else packed.matmul
    bias = _x(1, n, seed=22)[0]
    x = _x(301, k, seed=23)
    alone = torch.cat([run(x[i:i + 1], bias) for i in range(x.shape[0])])
    threads = torch.get_num_threads()
    try:
        for lo, hi in ((0, 16), (5, 22), (0, 64), (7, 301), (0, 301)):
            assert torch.equal(run(x[lo:hi], bias), alone[lo:hi]), (lo, hi)
        torch.set_num_threads(1)
        assert torch.equal(run(x[3:200], bias), alone[3:200])
    finally:
        torch.set_num_threads(threads)


@needs_kernel
@pytest.mark.parametrize("qtype", FORMATS)
def test_a_row_does_not_depend_on_the_other_rows_or_threads(qtype, not_invariant):
    weight, _ = _quantized(qtype, 200, 576, seed=11)
    packed = quant_bf16_dot.QuantPanelWeight(weight)
    x = _x(60, 576, seed=12)
    threads = torch.get_num_threads()
    try:
        for rows in ((0, 1), (0, 3), (0, 5), (2, 9), (5, 15), (0, 16), (3, 40), (0, 60)):  # within each path
            batch = packed.matmul(x[rows[0]:rows[1]])
            first = packed.matmul(x[rows[0]:rows[0] + (1 if rows[1] - rows[0] < LARGE_M else LARGE_M)])
            assert torch.equal(batch[:first.shape[0]], first), rows
            torch.set_num_threads(1)
            assert torch.equal(packed.matmul(x[rows[0]:rows[1]]), batch), rows
            torch.set_num_threads(threads)
    finally:
        torch.set_num_threads(threads)


@needs_kernel
@pytest.mark.parametrize("qtype", FORMATS)
@pytest.mark.parametrize("m", [1, 2, 3, 5, LARGE_M, 40])
def test_gated_equals_the_unfused_linear_then_silu_and_mul(qtype, m):
    intermediate, k = 96, 64
    weight, _ = _quantized(qtype, 2 * intermediate, k, seed=m)
    gated = quant_bf16_dot.GatedQuantPanelWeight(weight, fused_ops.silu_table())
    plain = quant_bf16_dot.QuantPanelWeight(weight)
    x, bias = _x(m, k, seed=m + 1), _x(1, 2 * intermediate, seed=m + 2)[0]
    both = plain.matmul(x, bias)
    expected = torch.nn.functional.silu(both[:, :intermediate]) * both[:, intermediate:]
    assert torch.equal(gated.silu_and_mul(x, bias), expected)


@needs_kernel
def test_int8_per_channel_is_q8_with_the_channel_scale():
    w = torch.randn(70, 128, generator=torch.Generator().manual_seed(1))
    weight = quant_bf16_dot.quantize_int8(w)
    rows = weight.rows.view(70, 4, 34)
    scale = rows[:, 0, :2].contiguous().view(torch.float16).float()  # [70, 1]
    assert torch.equal(rows[:, :, :2], rows[:, :1, :2].expand(70, 4, 2))  # one scale per channel
    q = rows[:, :, 2:].contiguous().view(torch.int8).reshape(70, 128).float()
    assert (w - scale * q).abs().max() <= scale.max() / 2 * 1.001  # rounded to the nearest step
    dequantized = scale * q
    x = _x(3, 128, seed=2)
    got = quant_bf16_dot.QuantPanelWeight(weight).matmul(x).double()
    exact = x.double() @ dequantized.double().T
    assert torch.all((got - exact).abs() <= exact.abs() * 2**-8 + (x.double().abs() @ dequantized.double().abs().T) * 2**-16)


@needs_kernel
@pytest.mark.parametrize("qtype", FORMATS)
def test_rows_of_are_the_dequantized_rows(qtype):
    weight, dequantized = _quantized(qtype, 100, 64, seed=4)
    ids = torch.tensor([0, 5, 99, 17, 5])
    assert torch.equal(quant_bf16_dot.QuantPanelWeight(weight).rows_of(ids), dequantized[ids].to(torch.bfloat16))


def test_bad_shapes_are_refused_with_the_limit():
    with pytest.raises(ValueError, match="q4_1 weight of 48 inputs"):
        quant_bf16_dot.QuantizedTensor(torch.zeros(4, 30, dtype=torch.uint8), "q4_1", 48)
    with pytest.raises(ValueError, match="q5_k weight of 32 inputs"):  # a K-quant super-block holds 256
        quant_bf16_dot.QuantizedTensor(torch.zeros(4, 22, dtype=torch.uint8), "q5_k", 32)
    with pytest.raises(ValueError, match="not supported"):
        quant_bf16_dot.QuantizedTensor(torch.zeros(4, 20, dtype=torch.uint8), "iq4_xs", 32)


@pytest.mark.parametrize("qtype", ["q5_0", "q5_1", "q4_k", "q5_k", "q6_k"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_types_only_quant_dot_takes_go_to_it_in_every_engine(qtype, dtype):
    from engine_core.layers import cpu_packing
    from engine_core.cpu_kernels.linear import quant_int8_rows

    weight, _ = _quantized(qtype, 8, 256, seed=1)
    assert not quant_bf16_dot.can_pack(weight)
    assert isinstance(cpu_packing.pack_quantized(weight, dtype), quant_int8_rows.QuantDotWeight)
