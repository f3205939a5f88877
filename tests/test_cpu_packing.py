"""bfloat16 linear layers with oneDNN-packed weights compute what F.linear computes."""

import pytest
import torch
import torch.nn.functional as F

from engine_core.layers import cpu_packing
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


def test_only_bfloat16_on_the_cpu_is_packed():
    assert not cpu_packing.can_pack(torch.device("cpu"), torch.float32)
    assert not cpu_packing.can_pack(torch.device("cuda"), torch.bfloat16)
