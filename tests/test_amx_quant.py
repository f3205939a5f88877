"""The kept-quantized linear kernel on AMX tiles (amx_quant.c, opt-in with NVLLM_CPU_AMX_QUANT=1): the dense AMX
kernel's bits on the dequantized weights, a row's bits the same at every row count (1, 7, 16, 33, 512 rows),
and off unless asked for."""

import pytest
import torch

from engine_core.cpu_kernels import table, tiers
from engine_core.layers import cpu_gemm, cpu_ops, cpu_quant
from engine_core.layers.activation import silu_and_mul
from gguf_weights import quantized_weight

pytestmark = pytest.mark.integration

ROWS = (1, 7, 16, 33, 512)


def _bf16(*shape, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


@pytest.fixture
def amx_quant(monkeypatch):
    monkeypatch.setenv("NVLLM_CPU_AMX_QUANT", "1")
    table.forget()
    if cpu_quant.load() is None or cpu_quant.load() is not cpu_quant._amx_library() \
            or cpu_gemm.load() is not cpu_gemm._amx_library():
        table.forget()
        pytest.skip("needs AMX (amx_bf16) with the tile state granted: amx_quant.c does not run here")
    yield
    monkeypatch.delenv("NVLLM_CPU_AMX_QUANT")
    table.forget()


@pytest.mark.skipif(not tiers.at_least("amx"), reason="needs the amx tier")
def test_off_unless_asked_for(monkeypatch):
    monkeypatch.delenv("NVLLM_CPU_AMX_QUANT", raising=False)
    table.forget()
    assert table.serving("kept-quantized linear bfloat16") != "linear/amx_quant.c"


@pytest.mark.parametrize("qtype", ["q4_0", "q4_1", "q8_0"])
@pytest.mark.parametrize("n,k", [(576, 576), (960, 576), (576, 1536), (40, 64), (17, 96)])
def test_the_dense_kernels_bits_on_the_dequantized_weights(amx_quant, qtype, n, k):
    weight, _ = quantized_weight(qtype, n, k, seed=n + k)
    packed = cpu_quant.QuantPanelWeight(weight)
    assert packed.kernel == "linear/amx_quant.c"
    dense = cpu_gemm.PanelWeight(packed.rows_of(torch.arange(n)))  # bf16(d q + m), as the kernel unpacks them
    x, bias = _bf16(max(ROWS), k, seed=k), _bf16(n, seed=2)
    whole = packed.matmul(x, bias)
    assert torch.equal(whole, dense.matmul(x, bias))
    for rows in ROWS:
        assert torch.equal(packed.matmul(x[:rows], bias), whole[:rows]), rows
        assert torch.equal(packed.matmul(x[rows - 1: rows], bias), whole[rows - 1: rows]), rows


@pytest.mark.parametrize("qtype", ["q4_1", "q8_0"])
def test_gated_equals_the_plain_product_then_silu_and_mul(amx_quant, qtype):
    weight, _ = quantized_weight(qtype, 2 * 1536, 576, seed=5)
    bias = _bf16(2 * 1536, seed=6)
    gated = cpu_quant.GatedQuantPanelWeight(weight, cpu_ops.silu_table())
    plain = cpu_quant.QuantPanelWeight(weight)
    x = _bf16(max(ROWS), 576, seed=3)
    whole = gated.silu_and_mul(x, bias)
    assert torch.equal(whole, silu_and_mul(plain.matmul(x, bias)))
    for rows in ROWS:
        assert torch.equal(gated.silu_and_mul(x[rows - 1: rows], bias), whole[rows - 1: rows]), rows
