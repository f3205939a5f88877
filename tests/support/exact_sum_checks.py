"""Checks both exact-integer kept-quantized kernels of the amx tier pass (amx_quant.c, quant_vnni.c): a row's bits
the same at every row count, shuffled among others, strided, on one thread or two; the gated product equal to the
plain one then SiLU-and-mul; embedding rows equal to the dequantized weights."""

import torch

from engine_core.cpu_kernels.ops import fused_ops
from engine_core.cpu_kernels.linear import quant_bf16_dot
from engine_core.layers.activation import silu_and_mul
from tests.support.gguf_weights import quantized_weight

ROWS = (1, 7, 16, 33, 512)
FORMATS = ["q4_0", "q4_1", "q8_0"]


def bf16_randn(*shape, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


def assert_rows_alike(matmul, x: torch.Tensor, bias, whole: torch.Tensor) -> None:
    """matmul's rows of x (max(ROWS) of them) are whole's at every count, the last one alone, and shuffled."""
    for rows in ROWS:
        assert torch.equal(matmul(x[:rows], bias), whole[:rows]), rows
        assert torch.equal(matmul(x[rows - 1: rows], bias), whole[rows - 1: rows]), rows
    shuffled = torch.randperm(33, generator=torch.Generator().manual_seed(1))
    assert torch.equal(matmul(x[:33][shuffled], bias), whole[:33][shuffled])


def assert_threads_and_strides_alike(qtype: str) -> tuple[quant_bf16_dot.QuantPanelWeight, torch.Tensor, torch.Tensor]:
    """Strided rows and one thread give a row the bits of contiguous rows on every thread; returns (the packed
    weight, the strided rows, their product) for more checks."""
    weight, _ = quantized_weight(qtype, 1000, 576, seed=4)
    packed = quant_bf16_dot.QuantPanelWeight(weight)
    x = bf16_randn(67, 700, seed=5)[:, 100:676]
    whole = packed.matmul(x)
    assert torch.equal(whole, packed.matmul(x.contiguous()))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(packed.matmul(x), whole)
    finally:
        torch.set_num_threads(threads)
    return packed, x, whole


def assert_gated_is_plain_then_silu(qtype: str) -> None:
    weight, _ = quantized_weight(qtype, 2 * 1536, 576, seed=6)
    bias = bf16_randn(2 * 1536, seed=7)
    gated = quant_bf16_dot.GatedQuantPanelWeight(weight, fused_ops.silu_table())
    plain = quant_bf16_dot.QuantPanelWeight(weight)
    x = bf16_randn(max(ROWS), 576, seed=8)
    whole = gated.silu_and_mul(x, bias)
    assert torch.equal(whole, silu_and_mul(plain.matmul(x, bias)))
    for rows in ROWS:
        assert torch.equal(gated.silu_and_mul(x[rows - 1: rows], bias), whole[rows - 1: rows]), rows


def assert_embedding_rows_dequantized(qtype: str) -> None:
    weight, dequantized = quantized_weight(qtype, 100, 96, seed=9)
    packed = quant_bf16_dot.QuantPanelWeight(weight)
    ids = torch.tensor([0, 17, 99, 17, 42])
    assert torch.equal(packed.rows_of(ids), dequantized[ids].to(torch.bfloat16))
