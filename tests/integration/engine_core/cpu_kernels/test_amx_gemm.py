"""The bf16 linear kernel on AMX tiles (amx_gemm.c): its values against a float64 reference, and a row's bits
the same at every row count (1, 7, 16, 33, 512 rows), alone or among others, plain and gated."""

import pytest
import torch

from engine_core.cpu_kernels import table
from engine_core.cpu_kernels.linear import dense_linear
from engine_core.cpu_kernels.ops import fused_ops
from engine_core.layers.activation import silu_and_mul

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(dense_linear.load() is None or dense_linear.load() is not dense_linear._amx_library(),
                                 reason="needs AMX (amx_bf16) with the tile state granted: amx_gemm.c does not run here")]

ROWS = (1, 7, 16, 33, 512)


def _bf16(*shape, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


def test_the_amx_kernel_serves_bf16_linears():
    assert table.serving("linear bfloat16") == "linear/amx_gemm.c"
    assert dense_linear.PanelWeight(_bf16(32, 64, seed=0)).kernel == "linear/amx_gemm.c"


@pytest.mark.parametrize("n,k", [(576, 576), (960, 576), (576, 1536), (48, 64), (17, 96)])
def test_values_against_float64_and_rows_alike(n, k):
    w, bias = _bf16(n, k, seed=n + k), _bf16(n, seed=3)
    packed = dense_linear.PanelWeight(w)
    x = _bf16(max(ROWS), k, seed=k)
    whole = packed.matmul(x, bias)
    expected = x.double() @ w.double().T + bias.double()
    # one fp32 sum rounded once to bf16: bf16's half ulp of the exact value plus the fp32 sum's error
    assert torch.all((whole.double() - expected).abs() <= expected.abs() * 2**-8 + k * 2**-20)
    for rows in ROWS:
        assert torch.equal(packed.matmul(x[:rows], bias), whole[:rows]), rows
        assert torch.equal(packed.matmul(x[rows - 1: rows], bias), whole[rows - 1: rows]), rows
    shuffled = torch.randperm(33, generator=torch.Generator().manual_seed(1))
    assert torch.equal(packed.matmul(x[:33][shuffled], bias), whole[:33][shuffled])


def test_threads_do_not_change_a_row():
    packed = dense_linear.PanelWeight(_bf16(1000, 576, seed=4))
    x = _bf16(67, 576, seed=5)
    threads = torch.get_num_threads()
    whole = packed.matmul(x)
    try:
        torch.set_num_threads(1)
        assert torch.equal(packed.matmul(x), whole)
    finally:
        torch.set_num_threads(threads)


def test_gated_equals_the_plain_product_then_silu_and_mul():
    w, bias = _bf16(2 * 1536, 576, seed=6), _bf16(2 * 1536, seed=7)
    table_ = fused_ops.silu_table()
    plain, gated = dense_linear.PanelWeight(w), dense_linear.GatedPanelWeight(w, table_)
    x = _bf16(max(ROWS), 576, seed=8)
    whole = gated.silu_and_mul(x, bias)
    assert torch.equal(whole, silu_and_mul(plain.matmul(x, bias)))
    for rows in ROWS:
        assert torch.equal(gated.silu_and_mul(x[rows - 1: rows], bias), whole[rows - 1: rows]), rows


def test_a_shape_the_tiles_do_not_take_runs_the_panels():
    w, x = _bf16(40, 30, seed=9), _bf16(9, 30, seed=10)  # K not a multiple of 32
    expected = x.double() @ w.double().T
    got = dense_linear.PanelWeight(w).matmul(x)
    assert torch.all((got.double() - expected).abs() <= expected.abs() * 2**-8 + 1e-4)
