"""RMSNorm's fixed-order row statistic (rms_fixed_order.c): close to torch's, and a row's bits independent of
the row count and threads, also where torch splits one row's sum across threads (40000 values)."""

import pytest
import torch

from engine_core.platform.batch_invariance import set_batch_invariant
from engine_core.cpu_kernels.ops import rms_fixed_order
from engine_core.layers.norm import RMSNorm

pytestmark = [pytest.mark.unit, pytest.mark.skipif(rms_fixed_order.load() is None, reason="no C compiler")]


@pytest.mark.parametrize("n", [1, 16, 17, 576, 40000])
def test_close_to_torch_and_the_same_bits_in_any_batch(n):
    x = torch.randn(40, n, generator=torch.Generator().manual_seed(n)) * 3
    expected = torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-5).float()
    threads = torch.get_num_threads()
    try:
        alone = torch.cat([rms_fixed_order.inverse_rms(x[i: i + 1], 1e-5) for i in range(len(x))])
        torch.testing.assert_close(alone, expected, rtol=1e-5, atol=0)
        for num_threads in (1, 2):
            torch.set_num_threads(num_threads)
            for m in (1, 2, 3, 7, 40):
                assert torch.equal(rms_fixed_order.inverse_rms(x[:m], 1e-5), alone[:m])
    finally:
        torch.set_num_threads(threads)


def test_rmsnorm_uses_it_when_batch_invariant_and_keeps_torch_otherwise():
    norm = RMSNorm(64, eps=1e-5)
    norm.weight.data = torch.randn(64, generator=torch.Generator().manual_seed(1))
    x = torch.randn(5, 3, 64, generator=torch.Generator().manual_seed(2))  # [T, H, D] as q/k norms see it
    got = norm(x)
    assert torch.equal(got, norm.weight * (x * rms_fixed_order.inverse_rms(x, 1e-5)))
    set_batch_invariant(False)
    try:
        assert torch.equal(norm(x), norm.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)))
    finally:
        set_batch_invariant(True)
    torch.testing.assert_close(got, norm(x))


def test_declines_other_dtypes():
    assert rms_fixed_order.inverse_rms(torch.ones(2, 8, dtype=torch.bfloat16), 1e-5) is None
