"""Linear layers with packed weights compute what F.linear computes; which kernel packs which weight
(bfloat16: dense_linear or oneDNN, or the generic fixed-order kernel where dense_linear cannot run; float32:
the generic kernel when batch-invariant, else F.linear)."""

import pytest
import torch
import torch.nn.functional as F

from engine_core.cpu_kernels import tiers
from engine_core.platform.batch_invariance import set_batch_invariant
from engine_core.layers import cpu_packing
from engine_core.cpu_kernels.linear import dense_linear
from engine_core.layers.embedding import ParallelLMHead
from engine_core.layers.linear import ColumnParallelLinear, QKVParallelLinear, RowParallelLinear

pytestmark = pytest.mark.integration

needs_packing = pytest.mark.skipif(not cpu_packing.can_pack(torch.device("cpu"), torch.bfloat16),
                                   reason="this torch build has no oneDNN bf16 linear")


def _random_(layer: torch.nn.Module) -> torch.nn.Module:
    g = torch.Generator().manual_seed(0)
    for p in layer.parameters():
        p.data = torch.randn(p.shape, generator=g).to(torch.bfloat16)
    return layer


@needs_packing
@pytest.mark.parametrize("rows", [1, 7, 32, 300])
def test_packed_layers_equal_f_linear(rows):
    x = torch.randn(rows, 64, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    layers = [_random_(ColumnParallelLinear(64, 96, bias=True)), _random_(RowParallelLinear(64, 48)),
              _random_(QKVParallelLinear(64, 16, 4, 2)), _random_(ParallelLMHead(1000, 64))]
    for layer in layers:
        expected = F.linear(x, layer.weight, getattr(layer, "bias", None))
        assert cpu_packing.pack_model(layer) == 1
        assert layer.packed_weight is not None
        torch.testing.assert_close(layer(x), expected, rtol=1e-2, atol=1e-2)


@needs_packing
def test_packing_frees_linear_weights_but_not_a_tied_head():
    linear = _random_(ColumnParallelLinear(64, 96))
    head = _random_(ParallelLMHead(1000, 64))
    cpu_packing.pack_model(linear)
    cpu_packing.pack_model(head)
    assert linear.weight.numel() == 0
    assert head.weight.shape == (1000, 64)  # the embedding it may be tied to still reads it


def test_without_batch_invariance_only_bfloat16_on_the_cpu_is_packed(not_invariant):
    assert not cpu_packing.can_pack(torch.device("cpu"), torch.float32)
    assert not cpu_packing.can_pack(torch.device("cuda"), torch.bfloat16)


needs_generic = pytest.mark.skipif(dense_linear.load_fixed_order() is None, reason="no C compiler: the generic kernel is not built")


@needs_generic
@pytest.mark.parametrize("rows", [1, 7, 300])
def test_batch_invariant_float32_layers_use_the_generic_kernel(rows):
    assert cpu_packing.can_pack(torch.device("cpu"), torch.float32)
    assert not cpu_packing.can_pack(torch.device("cuda"), torch.float32)
    x = torch.randn(rows, 64, generator=torch.Generator().manual_seed(1))
    layers = [ColumnParallelLinear(64, 96, bias=True), RowParallelLinear(64, 48), QKVParallelLinear(64, 16, 4, 2),
              ParallelLMHead(1000, 64)]
    for layer in layers:
        for p in layer.parameters():
            p.data = torch.randn(p.shape, generator=torch.Generator().manual_seed(0))
        expected = F.linear(x, layer.weight, getattr(layer, "bias", None))
        assert cpu_packing.pack_model(layer) == 1
        assert isinstance(layer.packed_weight, dense_linear.GenericPanelWeight)
        torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-4)
    assert layers[0].weight.numel() == 0 and layers[3].weight.shape == (1000, 64)  # a tied head keeps its weight


@needs_generic
@pytest.mark.parametrize("onednn_bf16", [
    pytest.param(True, id="onednn-bf16-runs", marks=pytest.mark.skipif(
        not cpu_packing._onednn_bf16_runs(), reason="needs AVX512 BW/VL/DQ or AVX-NE-CONVERT (oneDNN's bf16 kernels)")),
    pytest.param(False, id="avx2-only")])
def test_bfloat16_without_avx512_bf16_uses_the_generic_kernel(monkeypatch, onednn_bf16):
    """Batch-invariant: the generic kernel. Not: oneDNN where its bf16 kernels run (AVX512 BW/VL/DQ), and the
    generic kernel again on an AVX2-only CPU, where oneDNN refuses a bf16 weight at its first reorder."""
    monkeypatch.setattr(dense_linear, "load", lambda: None)  # as on a CPU without AVX512-BF16
    monkeypatch.setattr(cpu_packing, "_onednn_bf16_runs", lambda: onednn_bf16)
    w = torch.randn(96, 64).to(torch.bfloat16)
    assert isinstance(cpu_packing.pack(w), dense_linear.GenericPanelWeight)
    set_batch_invariant(False)
    try:
        packed = cpu_packing.pack(w)
        assert isinstance(packed, cpu_packing.OneDnnWeight if onednn_bf16 else dense_linear.GenericPanelWeight)
        assert cpu_packing.can_pack(torch.device("cpu"), torch.bfloat16)
        x = torch.randn(5, 64).to(torch.bfloat16)
        torch.testing.assert_close(packed.matmul(x), x @ w.T, rtol=2e-2, atol=2e-2)
    finally:
        set_batch_invariant(True)


@pytest.mark.skipif(dense_linear._library() is None, reason="needs AVX512-BF16: dense_bf16_dot.c does not run on this CPU")
def test_amx_cpus_keep_cpu_gemm_when_batch_invariant(monkeypatch):
    monkeypatch.setattr(tiers, "active_tier", lambda: "amx")
    assert dense_linear.load() is not None
    set_batch_invariant(False)
    try:
        assert dense_linear.load() is None  # oneDNN's AMX kernels, faster but not batch-invariant
    finally:
        set_batch_invariant(True)
