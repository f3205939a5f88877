"""The kept-quantized bf16 linear kernel of the amx tier (amx_quant.c: inputs as 16-bit digits, exact block sums,
AVX512 register tiles for a few rows and AMX tiles for more): its values against the dequantized float64 product,
a row's bits the same at every row count (1, 7, 16, 33, 512 rows: both units), alone or among others, on one
thread or two, with or without batch invariance asked for, plain and gated, and the embedding rows it keeps.
Its arithmetic for prompt rows is amx_gemm.c's on the dequantized model's weights, bit for bit, at every row count,
and so is that of the prompt rows of quant_int8_rows.c's Q5_0 / Q5_1 layers (dot_prompt_linear_bf16)."""

import pytest
import torch

from engine_core.cpu_kernels import table
from engine_core.cpu_kernels.linear import dense_linear, quant_bf16_dot, quant_int8_rows
from engine_core.cpu_kernels.ops import fused_ops
from engine_core.layers.forward_context import forward_context
from tests.support.exact_sum_checks import (FORMATS, ROWS, assert_embedding_rows_dequantized,
                                            assert_gated_is_plain_then_silu, assert_rows_alike,
                                            assert_threads_and_strides_alike, bf16_randn)
from tests.support.gguf_weights import quantized_weight

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(quant_bf16_dot.load() is None or quant_bf16_dot.load() is not quant_bf16_dot._amx_library(),
                                 reason="needs AMX (amx_bf16) with the tile state granted: amx_quant.c does not run "
                                        "here")]


def test_it_serves_kept_quantized_bf16_linears():
    assert table.serving("kept-quantized linear bfloat16") == "linear/amx_quant.c"


@pytest.mark.parametrize("qtype", FORMATS)
@pytest.mark.parametrize("n,k", [(576, 576), (960, 576), (576, 1536), (40, 64), (17, 96), (1, 32)])
def test_values_and_rows_alike(qtype, n, k):
    weight, dequantized = quantized_weight(qtype, n, k, seed=n + k)
    packed = quant_bf16_dot.QuantPanelWeight(weight)
    assert packed.kernel == "linear/amx_quant.c"
    x, bias = bf16_randn(max(ROWS), k, seed=k), bf16_randn(n, seed=2)
    whole = packed.matmul(x, bias)
    exact = x.double() @ dequantized.double().T + bias.double()
    # each input off by at most its block's largest |x| / 65534 (16-bit digits), exact block sums, fp32 totals,
    # one bf16 rounding
    blocks = k // 32
    step = x.double().abs().view(-1, blocks, 32).amax(-1) / 65534
    digits = step @ dequantized.double().abs().view(n, blocks, 32).sum(-1).T
    scale = x.double().abs() @ dequantized.double().abs().T + bias.double().abs()
    assert torch.all((whole.double() - exact).abs() <= exact.abs() * 2**-8 + digits * 1.001 + scale * blocks * 2**-22)
    assert_rows_alike(packed.matmul, x, bias, whole)


@pytest.mark.parametrize("qtype", FORMATS)
def test_threads_strided_rows_and_invariance_off_do_not_change_a_row(qtype, monkeypatch):
    packed, x, whole = assert_threads_and_strides_alike(qtype)
    monkeypatch.setattr(quant_bf16_dot, "batch_invariant", lambda: False)  # the tiles serve every M either way
    assert torch.equal(packed.matmul(x), whole)


@pytest.mark.parametrize("qtype", FORMATS)
def test_gated_equals_the_plain_product_then_silu_and_mul(qtype):
    assert_gated_is_plain_then_silu(qtype)


@pytest.mark.parametrize("qtype", FORMATS)
def test_unit_inputs_pick_their_weights(qtype):
    """x = identity: each output is one weight d q + m, to within the fp32 rounding of the block's scale (a unit
    input is 32767 integers of 1 / 32767) and of the Q4 offset's fold; a misplaced nibble or byte cannot hide."""
    n, k = 40, 96
    weight, dequantized = quantized_weight(qtype, n, k, seed=7)
    packed = quant_bf16_dot.QuantPanelWeight(weight)
    eye = torch.eye(k, dtype=torch.bfloat16)
    expected = dequantized.T.double()
    for product in (torch.cat([packed.matmul(eye[i:i + 4]) for i in range(0, k, 4)]), packed.matmul(eye)):
        assert torch.all((product.double() - expected).abs() <= expected.abs() * 2**-8 + 1e-4 * expected.abs().max())


@pytest.mark.parametrize("qtype", FORMATS)
def test_embedding_rows_are_the_dequantized_weights(qtype):
    assert_embedding_rows_dequantized(qtype)


def test_a_row_of_zeros_among_others():
    weight, _ = quantized_weight("q4_1", 64, 64, seed=10)
    packed = quant_bf16_dot.QuantPanelWeight(weight)
    x = bf16_randn(3, 64, seed=11)
    x[0] = 0
    got = packed.matmul(x)
    assert torch.equal(got[0], torch.zeros(64, dtype=torch.bfloat16))
    assert torch.equal(got[1:], packed.matmul(x[1:]))


@pytest.mark.parametrize("qtype", FORMATS)
@pytest.mark.parametrize("n,k", [(960, 576), (576, 1536), (40, 64)])
def test_prompt_rows_are_the_dequantized_models_on_tiles(qtype, n, k):
    """prompt_matmul: the weights dequantized per slab (bf16(d q + m), gguf-py's values rounded once) through
    amx_gemm.c's tiles, so the same bits as the dense kernel on the dequantized model, for any rows among any."""
    assert table.serving("linear bfloat16") == "linear/amx_gemm.c"
    weight, dequantized = quantized_weight(qtype, n, k, seed=n + k + 1)
    packed, dense = quant_bf16_dot.QuantPanelWeight(weight), dense_linear.PanelWeight(dequantized.to(torch.bfloat16))
    x, bias = bf16_randn(max(ROWS), k, seed=k + 1), bf16_randn(n, seed=3)
    whole = packed.prompt_matmul(x, bias)
    assert torch.equal(whole, dense.matmul(x, bias))
    for rows in ROWS:
        assert torch.equal(packed.prompt_matmul(x[rows - 1: rows], bias), whole[rows - 1: rows]), rows


@pytest.mark.parametrize("qtype", FORMATS)
def test_gated_prompt_rows_are_the_dense_gated_kernels(qtype):
    weight, dequantized = quantized_weight(qtype, 2 * 1536, 576, seed=12)
    bias, table_ = bf16_randn(2 * 1536, seed=13), fused_ops.silu_table()
    gated = quant_bf16_dot.GatedQuantPanelWeight(weight, table_)
    dense = dense_linear.GatedPanelWeight(dequantized.to(torch.bfloat16), table_)
    x = bf16_randn(max(ROWS), 576, seed=14)
    whole = gated.prompt_silu_and_mul(x, bias)
    assert torch.equal(whole, dense.silu_and_mul(x, bias))
    for rows in ROWS:
        assert torch.equal(gated.prompt_silu_and_mul(x[:rows], bias), whole[:rows]), rows


def test_prompt_tiles_can_be_switched_off(monkeypatch):
    assert quant_bf16_dot.has_prompt_arithmetic(quant_bf16_dot.load())
    monkeypatch.setenv("NVLLM_CPU_PROMPT_TILES", "0")  # every row on the exact integer sums, every block shareable
    assert not quant_bf16_dot.has_prompt_arithmetic(quant_bf16_dot.load())


def _as_prompt(weight, x, bias, runs=None):
    """weight.matmul(x, bias) in a step whose prompt rows are `runs` (default: every row)"""
    with forward_context(None, None, prompt_runs=runs if runs is not None else [0, x.shape[0]]):
        return weight.matmul(x, bias)


@pytest.mark.parametrize("qtype", sorted(quant_bf16_dot.DOT_PROMPT_TYPES))
@pytest.mark.parametrize("n,k", [(960, 576), (896, 896), (40, 64), (17, 96)])
def test_q5_prompt_rows_are_the_dequantized_models_on_tiles(qtype, n, k):
    """quant_int8_rows.c's Q5 layers: prompt rows through the weights dequantized per slab from the file's blocks on
    amx_gemm.c's tiles (the dense kernel's bits on the dequantized model, any rows among any); output rows keep
    quant_int8_rows.c's 8-bit rows, and a step splits its rows by role."""
    weight, dequantized = quantized_weight(qtype, n, k, seed=n + k + 2)
    packed, dense = quant_int8_rows.QuantDotWeight(weight), dense_linear.PanelWeight(dequantized.to(torch.bfloat16))
    x, bias = bf16_randn(max(ROWS), k, seed=k + 2), bf16_randn(n, seed=4)
    whole = _as_prompt(packed, x, bias)
    assert torch.equal(whole, dense.matmul(x, bias))
    for rows in ROWS:
        assert torch.equal(_as_prompt(packed, x[rows - 1: rows], bias), whole[rows - 1: rows]), rows
    plain = packed.matmul(x[:8], bias)  # outside a step: every row an output row
    mixed = _as_prompt(packed, x[:8], bias, runs=[2, 5])
    assert torch.equal(mixed[2:5], whole[2:5]) and torch.equal(mixed[:2], plain[:2]) and torch.equal(mixed[5:], plain[5:])
    assert not torch.equal(plain[2:5], whole[2:5])  # two arithmetics, else the split above could not show


def test_k_quant_prompt_rows_keep_the_one_arithmetic():
    weight, _ = quantized_weight("q4_k", 64, 512, seed=5)
    packed, x = quant_int8_rows.QuantDotWeight(weight), bf16_randn(40, 512, seed=6)
    assert torch.equal(_as_prompt(packed, x, None), packed.matmul(x))
    whole = packed.matmul(x)  # 40 rows: AMX int8 tiles (from 24 rows); fewer: quant_int8_rows.c's register tiles
    for rows in (1, 16, 23, 24, 27):
        assert torch.equal(packed.matmul(x[:rows]), whole[:rows]), rows
