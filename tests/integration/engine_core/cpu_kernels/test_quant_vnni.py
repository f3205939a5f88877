"""The kept-quantized bf16 linear kernel of the amx tier (quant_vnni.c: 8-bit activations, exact integer block
sums): its values against the dequantized float64 product, a row's bits the same at every row count (1, 7, 16,
33, 512 rows), alone or among others, on one thread or two, plain and gated, and the embedding rows it keeps."""

import pytest
import torch

from engine_core.cpu_kernels import table, tiers
from engine_core.cpu_kernels.linear import quant_bf16_dot
from tests.support.exact_sum_checks import (FORMATS, ROWS, assert_embedding_rows_dequantized, assert_gated_is_plain_then_silu,
                              assert_rows_alike, assert_threads_and_strides_alike, bf16_randn)
from tests.support.gguf_weights import quantized_weight

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not table.runs_here("quant_bf16_dot") or not tiers.at_least("amx"),
                                 reason="needs the amx tier (AVX512-VNNI, AMX): quant_vnni.c does not serve here")]


@pytest.fixture(autouse=True, scope="module")
def _quant_vnni_on():
    """quant_vnni.c is opt-in (NVLLM_CPU_QUANT_VNNI=1)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("NVLLM_CPU_QUANT_VNNI", "1")
        table.forget()
        yield
    table.forget()


def test_it_serves_kept_quantized_bf16_linears():
    assert table.serving("kept-quantized linear bfloat16") == "linear/quant_vnni.c"


@pytest.mark.parametrize("qtype", FORMATS)
@pytest.mark.parametrize("n,k", [(576, 576), (960, 576), (576, 1536), (40, 64), (17, 96), (1, 32)])
def test_values_and_rows_alike(qtype, n, k):
    weight, dequantized = quantized_weight(qtype, n, k, seed=n + k)
    packed = quant_bf16_dot.QuantPanelWeight(weight)
    assert packed.kernel == "linear/quant_vnni.c"
    x, bias = bf16_randn(max(ROWS), k, seed=k), bf16_randn(n, seed=2)
    whole = packed.matmul(x, bias)
    exact = x.double() @ dequantized.double().T + bias.double()
    # each input rounded to 8 bits per block of 32 (off by at most the block's max |x| / 254), fp32 sums, then one
    # bf16 rounding
    blocks = k // 32
    step = x.double().abs().view(-1, blocks, 32).amax(-1) / 254
    bound = step @ dequantized.double().abs().view(n, blocks, 32).sum(-1).T
    assert torch.all((whole.double() - exact).abs() <= bound * 1.001 + exact.abs() * 2**-8 + 1e-6)
    assert_rows_alike(packed.matmul, x, bias, whole)


@pytest.mark.parametrize("qtype", FORMATS)
def test_threads_and_strided_rows_do_not_change_a_row(qtype):
    assert_threads_and_strides_alike(qtype)


@pytest.mark.parametrize("qtype", FORMATS)
def test_gated_equals_the_plain_product_then_silu_and_mul(qtype):
    assert_gated_is_plain_then_silu(qtype)


@pytest.mark.parametrize("qtype", FORMATS)
def test_embedding_rows_are_the_dequantized_weights(qtype):
    assert_embedding_rows_dequantized(qtype)


def test_a_row_of_zeros_and_a_huge_row():
    weight, _ = quantized_weight("q4_1", 64, 64, seed=10)
    packed = quant_bf16_dot.QuantPanelWeight(weight)
    x = torch.zeros(3, 64, dtype=torch.bfloat16)
    x[1] = 3e38
    x[2, 5] = -1.0
    got = packed.matmul(x)
    assert torch.equal(got[0], torch.zeros(64, dtype=torch.bfloat16))
    assert torch.equal(got[2:], packed.matmul(x[2:]))
