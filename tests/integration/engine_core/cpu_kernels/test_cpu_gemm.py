"""nvllm's bf16 linear kernel (dense_bf16_dot.c): the product it computes, and a row's result independent
of the other rows, the row count and the thread count."""

import pytest
import torch

from engine_core.layers import cpu_packing
from engine_core.cpu_kernels.linear import dense_linear
from engine_core.cpu_kernels.ops import fused_ops
from engine_core.layers.activation import silu_and_mul
from engine_core.layers.linear import ColumnParallelLinear, GateUpLinear

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(dense_linear.load() is None, reason="needs AVX512-BF16 (on AMX CPUs, batch invariance): dense_bf16_dot.c does not run on this CPU")]


def _bf16(*shape, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


def _reference(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    out = x.double() @ w.double().T
    return out + bias.double() if bias is not None else out


@pytest.mark.parametrize("n", [1, 15, 16, 17, 64, 65, 100, 1000])
@pytest.mark.parametrize("k", [2, 30, 64, 576])
def test_products_over_shapes_and_tails(n, k):
    w = _bf16(n, k, seed=n * 1000 + k)
    packed = dense_linear.PanelWeight(w)
    for m in (1, 2, 5, 6, 7, 13, 64):
        x = _bf16(m, k, seed=m)
        got = packed.matmul(x)
        assert got.shape == (m, n) and got.dtype is torch.bfloat16
        # an fp32 sum rounded once to bf16: within bf16's half-ulp of the exact product, plus the fp32 sum's error
        expected = _reference(x, w, None)
        assert torch.all((got.double() - expected).abs() <= expected.abs() * 2**-8 + k * 2**-20), (m, n, k)


def test_bias_is_added_before_rounding():
    w, x, bias = _bf16(40, 64, seed=1), _bf16(9, 64, seed=2), _bf16(40, seed=3) * 10
    got = dense_linear.PanelWeight(w).matmul(x, bias)
    expected = _reference(x, w, bias)
    assert torch.all((got.double() - expected).abs() <= expected.abs() * 2**-8 + 1e-4)


def test_a_row_does_not_depend_on_the_other_rows_or_threads():
    w = _bf16(1000, 576, seed=4)
    packed = dense_linear.PanelWeight(w)
    x = _bf16(67, 576, seed=5)
    threads = torch.get_num_threads()
    try:
        whole = packed.matmul(x)  # big enough to run on every thread
        alone = torch.cat([packed.matmul(x[i: i + 1]) for i in range(len(x))])  # one thread each
        assert torch.equal(whole, alone)
        shuffled = torch.randperm(len(x), generator=torch.Generator().manual_seed(6))
        assert torch.equal(packed.matmul(x[shuffled]), whole[shuffled])
        assert torch.equal(packed.matmul(torch.cat([_bf16(30, 576, seed=7), x]))[30:], whole)
        torch.set_num_threads(1)
        assert torch.equal(packed.matmul(x), whole)
    finally:
        torch.set_num_threads(threads)


def test_inputs_with_strided_rows_and_leading_dims():
    w = _bf16(48, 64, seed=8)
    packed = dense_linear.PanelWeight(w)
    wide = _bf16(10, 100, seed=9)
    x = wide[:, 20:84]  # rows 100 apart
    assert torch.equal(packed.matmul(x), packed.matmul(x.contiguous()))
    x3 = _bf16(2, 5, 64, seed=10)
    assert torch.equal(packed.matmul(x3), packed.matmul(x3.reshape(10, 64)).view(2, 5, 48))
    assert packed.matmul(x[:0]).shape == (0, 48)


def test_layers_pack_into_panels():
    layer = ColumnParallelLinear(64, 96, bias=True)
    layer.weight.data, layer.bias.data = _bf16(96, 64, seed=11), _bf16(96, seed=12)
    x = _bf16(7, 64, seed=13)
    expected = torch.nn.functional.linear(x, layer.weight, layer.bias)
    cpu_packing.pack_model(layer)
    assert isinstance(layer.packed_weight, dense_linear.PanelWeight)
    torch.testing.assert_close(layer(x), expected, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("intermediate,k", [(32, 64), (96, 130), (1536, 576)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_gated_matmul_equals_the_linear_then_silu_and_mul(intermediate, k, with_bias):
    table = fused_ops.silu_table()
    if table is None:
        pytest.skip("no fused CPU kernels")
    w = _bf16(2 * intermediate, k, seed=intermediate + k) * 3  # gates far into silu's tails too
    bias = _bf16(2 * intermediate, seed=14) if with_bias else None
    plain, gated = dense_linear.PanelWeight(w), dense_linear.GatedPanelWeight(w, table)
    for m in (1, 5, 6, 7, 64, 301):
        x = _bf16(m, k, seed=m + 15)
        assert torch.equal(gated.silu_and_mul(x, bias), silu_and_mul(plain.matmul(x, bias))), m
    x3 = _bf16(2, 3, k, seed=16)
    assert torch.equal(gated.silu_and_mul(x3, bias), gated.silu_and_mul(x3.reshape(6, k), bias).view(2, 3, -1))
    with pytest.raises(TypeError):
        gated.matmul(x3)


def test_gated_rows_do_not_depend_on_the_other_rows_or_threads():
    table = fused_ops.silu_table()
    if table is None:
        pytest.skip("no fused CPU kernels")
    gated = dense_linear.GatedPanelWeight(_bf16(3072, 576, seed=17), table)
    x = _bf16(67, 576, seed=18)
    threads = torch.get_num_threads()
    try:
        whole = gated.silu_and_mul(x)
        assert torch.equal(torch.cat([gated.silu_and_mul(x[i: i + 1]) for i in range(len(x))]), whole)
        torch.set_num_threads(1)
        assert torch.equal(gated.silu_and_mul(x), whole)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("intermediate", [64, 40])  # 40: not whole gated tiles, packed plainly
def test_gate_up_layer_packs_gated_where_it_can(intermediate):
    layer = GateUpLinear(64, intermediate)
    layer.weight.data = _bf16(2 * intermediate, 64, seed=19)
    x = _bf16(9, 64, seed=20)
    expected = silu_and_mul(dense_linear.PanelWeight(layer.weight.data).matmul(x))
    cpu_packing.pack_model(layer)
    gated = fused_ops.silu_table() is not None and intermediate % 32 == 0
    assert isinstance(layer.packed_weight, dense_linear.GatedPanelWeight) == gated
    assert torch.equal(layer(x), expected)
