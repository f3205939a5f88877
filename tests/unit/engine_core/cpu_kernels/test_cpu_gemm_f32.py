"""The generic fixed-order linear kernel (dense_fixed_order.c), float32 and bfloat16: the product it
computes, and each row's result the same bits whatever the row count, the row's place and the threads."""

import pytest
import torch
import torch.nn.functional as F

from tests.support.cpu_tier_helpers import forced_tier, tier_params
from engine_core.cpu_kernels.linear import dense_linear

pytestmark = [pytest.mark.unit,
              pytest.mark.skipif(dense_linear.load_fixed_order() is None, reason="no C compiler: the kernel is not built")]


def _random(*shape, seed: int, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n,k", [(1, 1), (15, 7), (16, 64), (17, 33), (100, 576), (1000, 129)])
def test_products_over_shapes_and_tails(dtype, n, k):
    w, bias = _random(n, k, seed=n + k, dtype=dtype), _random(n, seed=3, dtype=dtype)
    packed = dense_linear.GenericPanelWeight(w)
    for m in (1, 5, 6, 7, 64):
        x = _random(m, k, seed=m, dtype=dtype)
        for b in (None, bias):
            got = packed.matmul(x, b)
            assert got.shape == (m, n) and got.dtype is dtype
            exact = F.linear(x.double(), w.double(), None if b is None else b.double())
            # fp32 sums: the error of k fused multiply-adds; bf16: plus one rounding of the result
            bound = (exact.abs() * 2**-8 if dtype is torch.bfloat16 else 0) + k * 2**-20 * (1 + exact.abs())
            assert torch.all((got.double() - exact).abs() <= bound), (m, n, k)
    if dtype is torch.float32:  # and close to what F.linear gives
        x = _random(9, k, seed=9)
        torch.testing.assert_close(packed.matmul(x, bias), F.linear(x, w, bias), rtol=1e-4, atol=k * 1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n,k", [(200, 64), (40, 31)])
def test_a_row_does_not_depend_on_the_other_rows_or_threads(dtype, n, k):
    packed = dense_linear.GenericPanelWeight(_random(n, k, seed=4, dtype=dtype))
    bias = _random(n, seed=5, dtype=dtype)
    x = _random(300, k, seed=6, dtype=dtype)
    threads = torch.get_num_threads()
    try:
        alone = torch.cat([packed.matmul(x[i: i + 1], bias) for i in range(len(x))])
        for num_threads in (1, 2):
            torch.set_num_threads(num_threads)
            for m in (*range(1, 20), 31, 64, 65, 127, 200, 299, 300):
                assert torch.equal(packed.matmul(x[:m], bias), alone[:m]), (num_threads, m)
                assert torch.equal(packed.matmul(x[300 - m:], bias), alone[300 - m:]), (num_threads, m)
            shuffled = torch.randperm(len(x), generator=torch.Generator().manual_seed(7))
            assert torch.equal(packed.matmul(x[shuffled], bias), alone[shuffled])
    finally:
        torch.set_num_threads(threads)


def test_inputs_with_a_row_stride_and_leading_dims():
    w = _random(48, 40, seed=8)
    packed = dense_linear.GenericPanelWeight(w)
    wide = _random(6, 100, seed=9)
    x = wide[:, 10:50]  # rows 100 apart
    assert torch.equal(packed.matmul(x), packed.matmul(x.contiguous()))
    assert packed.matmul(x.reshape(2, 3, 40)).shape == (2, 3, 48)
    with pytest.raises(TypeError):
        packed.matmul(x.to(torch.bfloat16))


@pytest.mark.parametrize("cpu_tier", tier_params("own", "avx2", "portable"))
def test_a_float32_weight_of_bf16_values_is_stored_in_bf16_with_the_same_results(cpu_tier, monkeypatch):
    """bf16 storage is lossless or not used: half the panel bytes, float32 inputs and outputs, the float32
    panels' bits at every row count; a weight bf16 cannot hold keeps float32 panels."""
    w = _random(100, 576, seed=11, dtype=torch.bfloat16).float()
    bias, x = _random(100, seed=12), _random(300, 576, seed=13)
    with forced_tier(cpu_tier):
        half = dense_linear.GenericPanelWeight(w)
        monkeypatch.setenv(dense_linear.BF16_STORAGE_ENV, "0")
        full = dense_linear.GenericPanelWeight(w)
        assert (half.storage, full.storage) == (torch.bfloat16, torch.float32) and 2 * half.nbytes == full.nbytes
        for m in (1, 2, 5, 6, 7, 64, 300):
            got = half.matmul(x[:m], bias)
            assert got.dtype is torch.float32 and torch.equal(got, full.matmul(x[:m], bias)), m
        monkeypatch.delenv(dense_linear.BF16_STORAGE_ENV)
        assert dense_linear.GenericPanelWeight(w + 2**-20).storage is torch.float32
