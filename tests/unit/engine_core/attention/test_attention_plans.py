"""Per-step plans: the torch backend's gathers and the rotary rows are built once per step, by the first
layer that needs them, and reused by the layers after it."""

import pytest
import torch

from tests.support.attention_reference import reference_paged_attention
from engine_core.attention.metadata import AttentionMetadata
from engine_core.attention.torch_backend import TorchAttentionBackend
from engine_core.attention.torch_plan import TorchPlan
from engine_core.layers.forward_context import forward_context, get_forward_context
from engine_core.layers.rotary import RotaryEmbedding

pytestmark = pytest.mark.unit


def _mixed_step(block_size=4, num_kv_heads=2, group=2, head_dim=16):
    """Two decodes, then a chunk of 3 tokens after 5 cached ones; float32, so the SDPA path serves it."""
    g = torch.Generator().manual_seed(0)
    lens, q_lens = [6, 9, 8], [1, 1, 3]
    tables = torch.tensor([[0, 1, 0], [2, 3, 4], [5, 6, 0]], dtype=torch.int32)
    k_cache = torch.randn(8, block_size, num_kv_heads, head_dim, generator=g)
    v_cache = torch.randn(8, block_size, num_kv_heads, head_dim, generator=g)
    starts = [0, 1, 2, 5]
    slots = [int(tables[i, p // block_size]) * block_size + p % block_size
             for i, (n, ql) in enumerate(zip(lens, q_lens)) for p in range(n - ql, n)]
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots), query_start_loc=torch.tensor(starts, dtype=torch.int32),
        seq_lens=torch.tensor(lens, dtype=torch.int32), block_tables=tables, max_query_len=3, max_seq_len=9,
        num_decodes=2, query_start_loc_cpu=starts, seq_lens_cpu=lens)
    q = torch.randn(5, num_kv_heads * group, head_dim, generator=g)
    k = k_cache.view(-1, num_kv_heads, head_dim)[meta.slot_mapping].clone()
    v = v_cache.view(-1, num_kv_heads, head_dim)[meta.slot_mapping].clone()
    return q, k, v, k_cache, v_cache, meta


def test_torch_plan_built_once_and_shared_by_layers():
    q, k, v, k_cache, v_cache, meta = _mixed_step()
    assert meta.plan is None
    backend = TorchAttentionBackend()
    first = backend.forward(q, k, v, k_cache, v_cache, meta, 0.25)
    plan = meta.plan
    assert isinstance(plan, TorchPlan) and plan.decodes is not None and list(plan.prefills) == [2]
    decodes, prefill = plan.decodes, plan.prefills[2]
    second = backend.forward(q, k, v, k_cache, v_cache, meta, 0.25)  # the next layer: same plan, same parts
    assert meta.plan is plan and plan.decodes is decodes and plan.prefills[2] is prefill
    assert torch.equal(first, second)
    ref = reference_paged_attention(q, k_cache, v_cache, meta.query_start_loc, meta.seq_lens, meta.block_tables, 0.25)
    torch.testing.assert_close(first, ref, atol=1e-5, rtol=1e-5)


def test_rotary_rows_looked_up_once_per_step_and_dtype():
    rotary = RotaryEmbedding(16, 64, 10000.0)
    positions = torch.tensor([3, 7, 8])
    _, _, _, _, _, meta = _mixed_step()
    x = torch.randn(3, 4, 16)
    alone = rotary.rotate(positions, x.clone())  # no forward context: looked up for this call only
    with forward_context(meta, TorchAttentionBackend()):
        plan = get_forward_context().rotary
        assert torch.equal(rotary.rotate(positions, x.clone()), alone)
        tables = plan.tables(rotary.cos, rotary.sin, positions, torch.float32)
        assert plan.tables(rotary.cos, rotary.sin, positions, torch.float32) is tables
        assert plan.tables(rotary.cos, rotary.sin, positions, torch.bfloat16).cos.dtype == torch.bfloat16
        torch.testing.assert_close(tables.cos[:, 0], rotary.cos[positions])
    with forward_context(meta, TorchAttentionBackend()):
        assert get_forward_context().rotary is not plan  # a new step, new rows


def _fresh_prefill(block_size=4, num_kv_heads=2, group=2, head_dim=16):
    """One prompt of 7 tokens with nothing cached: the torch backend's plain causal path."""
    g = torch.Generator().manual_seed(1)
    tables = torch.tensor([[3, 1]], dtype=torch.int32)
    k_cache = torch.randn(4, block_size, num_kv_heads, head_dim, generator=g)
    v_cache = torch.randn(4, block_size, num_kv_heads, head_dim, generator=g)
    slots = [int(tables[0, p // block_size]) * block_size + p % block_size for p in range(7)]
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots), query_start_loc=torch.tensor([0, 7], dtype=torch.int32),
        seq_lens=torch.tensor([7], dtype=torch.int32), block_tables=tables, max_query_len=7, max_seq_len=7,
        num_decodes=0, query_start_loc_cpu=[0, 7], seq_lens_cpu=[7])
    q = torch.randn(7, num_kv_heads * group, head_dim, generator=g)
    k = k_cache.view(-1, num_kv_heads, head_dim)[meta.slot_mapping].clone()
    v = v_cache.view(-1, num_kv_heads, head_dim)[meta.slot_mapping].clone()
    return q, k, v, k_cache, v_cache, meta


@pytest.mark.parametrize("backend_name", ["torch", "cpu_generic", "cpu_kernel"])
@pytest.mark.parametrize("window", [None, 3])
def test_soft_capped_scores_in_every_cpu_path(backend_name, window):
    """A cap of 0.5 (binding on these scores) over decodes, a chunk after cached blocks and a fresh prompt: the
    torch backend's SDPA paths spelled out with the cap, the generic C kernel, and the CPU kernel backend (whose
    paged_avx512_bf16.c does not cap: it hands capped layers to the generic kernel, so this runs on any CPU), against the
    reference."""
    from engine_core.cpu_kernels.attention import paged_fixed_order
    from engine_core.attention.cpu_generic_backend import CpuGenericAttentionBackend
    from engine_core.attention.cpu_kernel_backend import CpuKernelAttentionBackend
    backend = {"torch": TorchAttentionBackend, "cpu_generic": CpuGenericAttentionBackend,
               "cpu_kernel": CpuKernelAttentionBackend}[backend_name]()
    if backend_name != "torch" and paged_fixed_order.load() is None:
        pytest.skip("no C compiler: the generic kernel is not built")
    for make in (_mixed_step, _fresh_prefill):
        q, k, v, k_cache, v_cache, meta = make()
        q = 4 * q
        out = backend.forward(q, k, v, k_cache, v_cache, meta, 0.25, window, 0.5)
        args = (q, k_cache, v_cache, meta.query_start_loc, meta.seq_lens, meta.block_tables, 0.25, window)
        torch.testing.assert_close(out, reference_paged_attention(*args, 0.5), atol=1e-5, rtol=1e-5)
        assert not torch.allclose(out, reference_paged_attention(*args), atol=1e-2, rtol=1e-2)
