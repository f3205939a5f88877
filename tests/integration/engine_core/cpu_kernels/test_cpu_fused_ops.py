"""The fused bf16 CPU kernels (engine_core/layers/fused_torch_rounding.c) against the torch code they replace:
bit-identical results, odd shapes, strided inputs, in-place semantics, fallbacks."""

import pytest
import torch

from engine_core.cpu_kernels import table
from engine_core.cpu_kernels.ops import fused_ops, rms_fixed_order
from engine_core.layers.activation import silu_and_mul
from engine_core.layers.norm import RMSNorm
from engine_core.layers.rotary import RotaryEmbedding, _rotate

pytestmark = pytest.mark.integration

needs_kernel = pytest.mark.skipif(fused_ops.load() is None,
                                  reason="needs a CPU with AVX512 and a C compiler (the kernels are not built here)")
bf16 = torch.bfloat16


def _rand(*shape, seed=0, scale=True):
    """bf16 values over several magnitudes (row scales 1e-3 .. 1e2), as activations have."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g)
    if scale:
        x = x * torch.rand(*shape[:-1], 1, generator=g) * 10.0 ** torch.randint(-3, 3, (*shape[:-1], 1), generator=g)
    return x.to(bf16)


def _norm_module(n, seed=1):
    norm = RMSNorm(n, 1e-5).to(bf16)
    norm.weight.data = _rand(n, seed=seed, scale=False)
    return norm


def _torch_norm(norm, x, residual=None):
    """norm.py's torch code."""
    if residual is None:
        return norm._norm(x)
    s = x + residual
    return norm._norm(s), s


@needs_kernel
@pytest.mark.parametrize("tokens,n", [(1, 576), (3, 576), (17, 576), (2048, 576), (5, 16), (7, 43), (3, 1040),
                                      (2, 2048), (4, 4100), (2, 16384), (64, 896)])
def test_rms_norm_is_bit_identical(tokens, n):
    norm = _norm_module(n)
    x, residual = _rand(tokens, n, seed=2), _rand(tokens, n, seed=3)
    expected_out, expected_residual = _torch_norm(norm, x, residual)
    x_in, residual_in = x.clone(), residual.clone()
    out, new_residual = norm(x_in, residual_in)
    assert torch.equal(out, expected_out) and torch.equal(new_residual, expected_residual)
    # in place: the normed rows overwrite x, the new residual overwrites residual
    assert out.data_ptr() == x_in.data_ptr() and new_residual.data_ptr() == residual_in.data_ptr()

    out = norm(x)  # no residual: a new tensor, x untouched
    assert torch.equal(out, _torch_norm(norm, x)) and out.data_ptr() != x.data_ptr()


@needs_kernel
def test_rms_norm_statistic_is_norm_pys_batch_invariant_one():
    """Batch-invariant, norm.py takes its statistic from rms_fixed_order.c's fixed-order sum: so must the kernel, also
    on the rare rows where torch's own sum order rounds the output otherwise (2 of these 4096)."""
    norm = _norm_module(576, seed=12)
    x = _rand(4096, 576, seed=11)
    assert torch.equal(norm(x), _torch_norm(norm, x))
    torch_order = fused_ops._call_rms_norm(fused_ops.load().rms_norm_bf16, x, None, norm.weight, 1e-5)
    assert not torch.equal(torch_order, _torch_norm(norm, x))  # rows that tell the two orders apart


@needs_kernel
def test_rms_norm_no_residual_leaves_x():
    norm = _norm_module(576)
    x = _rand(9, 576, seed=4)
    before = x.clone()
    norm(x)
    assert torch.equal(x, before)


@needs_kernel
@pytest.mark.parametrize("head_dim", [64, 128, 40])
def test_rms_norm_per_head_on_a_strided_view(head_dim):
    """Qwen3's q/k norm: [T, H, D] views into the qkv projection's output (rows qkv-wide apart)."""
    tokens, heads, kv_heads = 17, 4, 2
    qkv = _rand(tokens, (heads + 2 * kv_heads) * head_dim, seed=5)
    q = qkv[:, : heads * head_dim].view(tokens, heads, head_dim)
    k = qkv[:, heads * head_dim: (heads + kv_heads) * head_dim].view(tokens, kv_heads, head_dim)
    norm = _norm_module(head_dim)
    for x in (q, k):
        out = norm(x)
        assert out.is_contiguous() and torch.equal(out, _torch_norm(norm, x))


@needs_kernel
def test_rms_norm_rows_do_not_depend_on_the_batch():
    """Batch invariance: a row's result is the same alone, in a small batch and in a threaded one."""
    norm = _norm_module(576)
    x, residual = _rand(2048, 576, seed=6), _rand(2048, 576, seed=7)
    big, _ = norm(x.clone(), residual.clone())
    for rows in (slice(5, 6), slice(100, 108)):
        small, _ = norm(x[rows].clone(), residual[rows].clone())
        assert torch.equal(small, big[rows])


@needs_kernel
def test_rms_norm_falls_back():
    norm = _norm_module(8)  # rows shorter than 16: torch sums them another way
    x = _rand(3, 8, seed=8)
    assert fused_ops.rms_norm(x, None, norm.weight, 1e-5) is None
    assert torch.equal(norm(x), _torch_norm(norm, x))
    strided = _rand(3, 128, seed=9)[:, ::2]  # elements not contiguous
    assert fused_ops.rms_norm(strided, None, _norm_module(64).weight, 1e-5) is None


@needs_kernel
@pytest.mark.parametrize("tokens,n", [(1, 1536), (3, 1536), (17, 1536), (2048, 1536), (3, 17), (5, 100), (2, 8)])
def test_silu_and_mul_is_bit_identical(tokens, n):
    x = _rand(tokens, 2 * n, seed=10) * 4
    gate, up = x.chunk(2, dim=-1)
    expected = torch.nn.functional.silu(gate) * up
    out = fused_ops.silu_and_mul(x)
    assert out is not None and torch.equal(out, expected)
    assert torch.equal(silu_and_mul(x), expected)


@needs_kernel
def test_silu_and_mul_every_bf16_gate():
    """All 65536 bf16 gate values (NaNs aside: their bits may differ)."""
    gate = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(bf16).view(256, 256)
    up = _rand(256, 256, seed=11, scale=False)
    expected = torch.nn.functional.silu(gate) * up
    out = fused_ops.silu_and_mul(torch.cat([gate, up], dim=1))
    nan = expected.isnan()
    assert torch.equal(out.isnan(), nan) and torch.equal(out[~nan], expected[~nan])


@needs_kernel
def test_silu_and_mul_strided_rows():
    wide = _rand(9, 3000, seed=12)
    x = wide[:, : 2 * 1000]  # rows 3000 apart
    gate, up = x.chunk(2, dim=-1)
    assert torch.equal(fused_ops.silu_and_mul(x), torch.nn.functional.silu(gate) * up)
    assert fused_ops.silu_and_mul(torch.randn(3, 64).half()) is None  # float16: torch


def _rotary_case(tokens, heads, kv_heads, head_dim, seed=13, max_position=4096):
    rotary = RotaryEmbedding(head_dim, max_position, 10000.0)
    g = torch.Generator().manual_seed(seed)
    positions = torch.randint(0, max_position, (tokens,), generator=g)
    positions[0] = max_position - 1
    qkv = _rand(tokens, (heads + 2 * kv_heads) * head_dim, seed=seed)
    qk = qkv[:, : (heads + kv_heads) * head_dim].view(tokens, heads + kv_heads, head_dim)
    cos = rotary.cos[positions].unsqueeze(1).to(bf16)
    sin = rotary.sin[positions].unsqueeze(1).to(bf16)
    return rotary, positions, qkv, qk, _rotate(qk, cos, sin)  # the torch code, as rotary.py runs it


@needs_kernel
@pytest.mark.parametrize("tokens,head_dim", [(1, 64), (3, 64), (17, 64), (2048, 64), (5, 128), (4, 80), (3, 34)])
def test_rotary_is_bit_identical_and_in_place(tokens, head_dim):
    rotary, positions, qkv, qk, expected = _rotary_case(tokens, 9, 3, head_dim)
    v = qkv[:, qk.shape[1] * head_dim:].clone()
    out = rotary.rotate(positions, qk)
    assert out.data_ptr() == qk.data_ptr()  # rotated in place
    assert torch.equal(out, expected)
    assert torch.equal(qkv[:, qk.shape[1] * head_dim:], v)  # v, beside q and k, untouched


@needs_kernel
def test_rotary_q_and_k_apart():
    """Qwen3's path: q and k normed into tensors of their own, then rotated."""
    rotary, positions, _, qk, expected = _rotary_case(7, 4, 2, 64)
    q, k = qk[:, :4].contiguous(), qk[:, 4:].contiguous()
    q, k = rotary(positions, q, k)
    assert torch.equal(torch.cat([q, k], dim=1), expected)


@needs_kernel
def test_rotary_falls_back():
    rotary, positions, _, qk, expected = _rotary_case(5, 2, 1, 64, max_position=64)
    before = qk.clone()
    bad = positions.clone()
    bad[2] = 64  # outside the tables: nothing written, torch then raises as it would
    assert not fused_ops.rotary(bad, qk, rotary.cos, rotary.sin) and torch.equal(qk, before)
    assert not fused_ops.rotary(positions.int(), qk, rotary.cos, rotary.sin)  # int32 positions: torch
    assert torch.equal(rotary.rotate(positions.int(), qk), expected)
    q16 = torch.randn(5, 3, 64).half()  # float16: torch
    assert not fused_ops.rotary(positions, q16, rotary.cos, rotary.sin)


@pytest.fixture
def fused_ops_off(monkeypatch):
    monkeypatch.setenv("NVLLM_CPU_FUSED_OPS", "0")
    table.forget()
    yield
    monkeypatch.undo()
    table.forget()  # later tests load the kernels again


def test_disabled_by_environment(fused_ops_off):
    assert fused_ops.load() is None
    norm = _norm_module(576)
    x, residual = _rand(3, 576, seed=14), _rand(3, 576, seed=15)
    x_before, residual_before = x.clone(), residual.clone()
    out, new_residual = norm(x, residual)
    expected_out, expected_residual = _torch_norm(norm, x_before, residual_before)
    assert torch.equal(out, expected_out) and torch.equal(new_residual, expected_residual)
    assert torch.equal(x, x_before) and torch.equal(residual, residual_before)  # the torch path is not in place
    gate_up = _rand(3, 64, seed=16)
    assert fused_ops.silu_and_mul(gate_up) is None
    rotary, positions, _, qk, expected = _rotary_case(3, 2, 1, 64)
    before = qk.clone()
    assert torch.equal(rotary.rotate(positions, qk), expected) and torch.equal(qk, before)


def _bf16_logits(path: str, lens: list[int]) -> torch.Tensor:
    from common.config import EngineArgs
    from engine_core.engine_config import resolve_engine_config
    from engine_core.worker.model_runner import ModelRunner, dummy_step

    args = EngineArgs(model=path, dtype="bfloat16", device="cpu", block_size=16, kv_cache_memory="16MiB")
    runner = ModelRunner(resolve_engine_config(args))
    runner.allocate_kv_cache(64)
    step, _ = dummy_step(lens, 16)
    g = torch.Generator().manual_seed(0)
    step.input_ids[:] = torch.randint(200, 40000, (len(step.input_ids),), generator=g).tolist()
    return runner.forward(step)


@needs_kernel
@pytest.mark.parametrize("arch", ["default", "qwen3"])
def test_bf16_model_logits_equal_the_torch_path(arch, monkeypatch, default_model_dir, tiny_models):
    """A bf16 step (decodes and prefills) gives the same logits, to the bit, with and without the kernels."""
    path = default_model_dir if arch == "default" else tiny_models[arch]
    lens = [1, 1, 1, 37, 5]
    with_kernels = _bf16_logits(path, lens)
    monkeypatch.setattr(fused_ops, "load", lambda: None)
    assert torch.equal(_bf16_logits(path, lens), with_kernels)


needs_f32_kernel = pytest.mark.skipif(fused_ops.load_f32() is None, reason="no C compiler: fused_fixed_order.c is not built")


@needs_f32_kernel
@pytest.mark.parametrize("tokens,n", [(1, 576), (3, 64), (40, 1536)])
def test_float32_norm_is_the_fixed_order_torch_arithmetic(tokens, n):
    """float32 (every tier): x + residual, the rms_fixed_order statistic, weight * (x * scale), as norm.py computes them."""
    g = torch.Generator().manual_seed(n)
    x, residual, weight = torch.randn(tokens, n, generator=g), torch.randn(tokens, n, generator=g), torch.randn(n, generator=g)
    assert torch.equal(fused_ops.rms_norm(x.clone(), None, weight, 1e-5), weight * (x * rms_fixed_order.inverse_rms(x, 1e-5)))
    summed = x + residual
    normed, new_residual = fused_ops.rms_norm(x.clone(), residual.clone(), weight, 1e-6)
    assert torch.equal(new_residual, summed)
    assert torch.equal(normed, weight * (summed * rms_fixed_order.inverse_rms(summed, 1e-6)))


@needs_f32_kernel
def test_float32_rotary_and_silu():
    g = torch.Generator().manual_seed(3)
    heads = torch.randn(5, 7, 64, generator=g)
    cos, sin = torch.randn(100, 64, generator=g), torch.randn(100, 64, generator=g)
    positions = torch.tensor([0, 3, 99, 50, 7])
    expected = _rotate(heads, cos[positions].unsqueeze(1), sin[positions].unsqueeze(1))
    assert fused_ops.rotary(positions, heads, cos, sin) and torch.equal(heads, expected)
    assert not fused_ops.rotary(torch.tensor([0, 1, 100, 2, 3]), heads, cos, sin)  # past the tables
    x = torch.randn(9, 2 * 300, generator=g) * 6
    gate, up = x.chunk(2, dim=-1)
    torch.testing.assert_close(fused_ops.silu_and_mul(x), torch.nn.functional.silu(gate) * up, rtol=1e-6, atol=1e-6)


@needs_f32_kernel
def test_float32_silu_same_bits_in_every_lane_and_close_to_the_exact_value():
    """SiLU's exponential is exp_f32.h's: 8 lanes at a time and the scalar tail give each value the same bits,
    within a few ulp of SiLU in float64, over the whole range (huge gates included)."""
    g = torch.Generator().manual_seed(5)
    gate = torch.cat([torch.randn(4000, generator=g) * 30, torch.tensor([-200.0, -88.5, -87.5, -1e-30, 0.0, 1e-30,
                                                                        87.5, 88.5, 200.0, float("inf")])])
    up = torch.randn(len(gate), generator=g)
    vector = fused_ops.silu_and_mul(torch.cat([gate, up]).view(1, -1))  # 8 lanes at a time (and a tail of 2)
    tail = torch.stack([fused_ops.silu_and_mul(torch.stack([v, u]).view(1, 2))[0, 0] for v, u in zip(gate, up)])
    assert torch.equal(vector[0], tail)  # n = 1: every value takes the scalar tail
    exact = (gate.double() * torch.sigmoid(gate.double()) * up.double())
    finite = exact.isfinite()
    error = (vector[0].double() - exact).abs()
    assert (error[finite] <= 4 * torch.finfo(torch.float32).eps * exact[finite].abs() + 1e-36).all()


@needs_f32_kernel
def test_float32_gelu_tanh_same_bits_in_every_lane_and_close_to_torch():
    """GELU's tanh form (Gemma's) with tanh_f32.h's tanh: 8 lanes at a time and the scalar tail give each value the
    same bits, within 1e-6 (relative to max(1, |value|)) of torch's gelu(approximate="tanh") and of the float64
    formula, over the whole range; in place over the gate half as the C loop runs it."""
    g = torch.Generator().manual_seed(6)
    gate = torch.cat([torch.randn(4000, generator=g) * 8, torch.tensor([-200.0, -12.0, -1e-30, 0.0, 1e-30, 12.0,
                                                                       200.0, float("inf"), float("-inf")])])
    up = torch.randn(len(gate), generator=g)
    vector = fused_ops.gelu_tanh_and_mul(torch.cat([gate, up]).view(1, -1))[0]  # 8 lanes at a time, a tail of 1
    tail = torch.stack([fused_ops.gelu_tanh_and_mul(torch.stack([v, u]).view(1, 2))[0, 0] for v, u in zip(gate, up)])
    torch.testing.assert_close(vector, tail, rtol=0, atol=0, equal_nan=True)  # -inf gives NaN (-inf * 0), as torch
    d = gate.double()
    exact = 0.5 * d * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (d + 0.044715 * d ** 3))) * up.double()
    finite = gate.isfinite()
    scale = exact[finite].abs().clamp(min=1)
    assert ((vector[finite].double() - exact[finite]).abs() <= 1e-6 * scale).all()
    theirs = torch.nn.functional.gelu(gate, approximate="tanh") * up
    assert ((vector[finite] - theirs[finite]).abs() <= 1e-6 * scale).all()
    assert vector[-2] == float("inf") * up[-2] and vector[-3] == 200 * up[-3]  # gelu(x) = x for large x
    rows = torch.randn(5, 2 * 40, generator=g) * 4
    in_place = rows.clone()
    library = fused_ops.load_f32()
    library.gelu_tanh_and_mul_f32(in_place.data_ptr(), 80, in_place.data_ptr(), 80, 5, 40, 1)
    assert torch.equal(in_place[:, :40], fused_ops.gelu_tanh_and_mul(rows))
