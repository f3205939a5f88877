"""CPU tiers (engine_core/cpu_kernels): the tier read from a CPU's flags, NVLLM_CPU_ISA forcing a lower one
(and refusing a higher one or a misspelt one), the table naming the kernel each operation gets, and the
kept-quantized kernels of every tier run for real on each tier this machine has: quant_exact_f32.c (float32) to the
bit the dense kernel's product of the dequantized weights; quant_int8_rows.c (every GGUF type kept, K-quants too) against the
float64 product of the dequantized weights and the 8-bit-rounded rows; both the same bits on every tier, and a
row's result independent of the other rows (M = 1..300) and of the thread count."""

import pytest
import torch

from tests.support.cpu_tier_helpers import forced_tier, tier_params, tiers_here
from engine_core.cpu_kernels import table, tiers
from engine_core.cpu_kernels.linear import dense_linear, quant_exact_f32, quant_int8_rows
from tests.support.gguf_weights import quantized_weight

pytestmark = pytest.mark.integration

AVX2 = {"avx2", "fma", "f16c", "bmi1", "bmi2", "movbe"}
AVX512 = AVX2 | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"}
FLAGS = {
    "portable": set(),
    "avx2": AVX2,
    "avx512": AVX512,
    "avx512_bf16": AVX512 | {"avx512_vnni", "avx512_bf16"},
    "amx": AVX512 | {"avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"},
}
FORMATS = ["q4_0", "q4_1", "q8_0"]  # quant_exact_f32.c's
# quant_int8_rows.c's types, each with shapes (n, k) of its block size: column tails, a partial group of 8 blocks
DOT_CASES = [(qtype, n, k) for qtype in ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0")
             for n, k in [(1, 32), (17, 96), (100, 576), (40, 288)]]
DOT_CASES += [(qtype, n, k) for qtype in ("q4_k", "q5_k", "q6_k") for n, k in [(1, 256), (17, 768), (40, 1536)]]


@pytest.mark.parametrize("tier", list(FLAGS))
def test_a_cpus_flags_give_its_tier(tier, monkeypatch):
    monkeypatch.setattr(tiers, "_x86", lambda: True)
    assert tiers.cpu_tier(frozenset(FLAGS[tier] | {"sse2", "ssse3"})) == tier


def test_avx2_without_f16c_is_portable_and_amx_needs_avx512_bf16(monkeypatch):
    monkeypatch.setattr(tiers, "_x86", lambda: True)
    assert tiers.cpu_tier(frozenset(AVX2 - {"f16c"})) == "portable"
    assert tiers.cpu_tier(frozenset(FLAGS["avx512"] | {"amx_tile", "amx_bf16", "amx_int8"})) == "avx512"


def test_nvllm_cpu_isa_forces_a_lower_tier_and_refuses_the_rest(monkeypatch):
    own = tiers.cpu_tier()
    for tier in tiers_here():
        with forced_tier(tier):
            assert tiers.active_tier() == tier
            assert tiers.describe() == tier if tier == own else tiers.describe().startswith(f"{tier} (forced")
    monkeypatch.setenv(tiers.ENV, "sse9")
    tiers.active_tier.cache_clear()
    with pytest.raises(ValueError, match="not a CPU tier .*portable, avx2, avx512, avx512_bf16, amx"):
        tiers.active_tier()
    if own != "amx":
        monkeypatch.setenv(tiers.ENV, "amx")
        tiers.active_tier.cache_clear()
        with pytest.raises(ValueError, match="needs CPU flags this CPU lacks.*amx"):
            tiers.active_tier()
    monkeypatch.delenv(tiers.ENV)
    table.forget()


def test_every_tier_builds_for_itself_never_for_this_machine():
    for tier in tiers.TIERS:
        assert "-march=native" not in tiers.compile_flags(tier)
    assert "-mavx512bf16" in tiers.compile_flags("amx") and "-mavx512bf16" not in tiers.compile_flags("avx512")


def test_prebuild_compiles_each_tiers_kernels_side_by_side_once(tmp_path, monkeypatch, caplog):
    """table.prebuild: every kernel of the asked tiers that is not turned off, compiled where the cache lacks it
    (here two small ones, at once), each behind its own lock; the loads that follow build nothing more, and a
    second prebuild has nothing left to do."""
    import logging
    import os

    kernels = {name: table.KERNELS[name] for name in ("rms_fixed_order", "fused_fixed_order")}
    monkeypatch.setattr(table, "KERNELS", kernels)
    monkeypatch.setenv("NVLLM_CACHE", str(tmp_path))
    monkeypatch.setenv("NVLLM_CPU_FUSED_OPS", "0")  # fused_fixed_order.c turned off: not built
    table.prebuild(("portable",), workers=2)
    built = sorted(name for name in os.listdir(tmp_path / "kernels") if name.endswith(".so"))
    assert [name.split("-")[:2] for name in built] == [["rms_fixed_order", "portable"]]
    monkeypatch.delenv("NVLLM_CPU_FUSED_OPS")
    table.prebuild(tuple(tiers_here()), workers=2)
    built = sorted(name for name in os.listdir(tmp_path / "kernels") if name.endswith(".so"))
    assert {tuple(name.split("-")[:2]) for name in built} == {
        (source, tier) for source in ("rms_fixed_order", "fused_fixed_order") for tier in tiers_here()}
    assert all(os.path.exists(tmp_path / "kernels" / (name + ".lock")) for name in built)  # a lock per build
    with caplog.at_level(logging.INFO, logger="nvllm"):
        table.prebuild(tuple(tiers_here()))
        for tier in tiers_here():
            with forced_tier(tier):
                assert table.load("rms_fixed_order") is not None
    assert not any("building" in r.message for r in caplog.records)


@pytest.mark.parametrize("tier", tier_params("portable", "avx2", "avx512", "avx512_bf16", "amx"))
def test_the_table_names_the_kernel_of_each_operation(tier):
    with forced_tier(tier):
        line = table.describe("float32")
        assert line.startswith(f"CPU kernels for tier {tier}")
        assert "kept-quantized linear: linear/quant_exact_f32.c" in line and "linear: linear/dense_fixed_order.c" in line
        bf16 = table.describe("bfloat16")
        fast, amx = tiers.rank(tier) >= tiers.rank("avx512_bf16"), tier == "amx"
        assert ("linear: linear/amx_gemm.c" if amx else "linear: linear/dense_bf16_dot.c") in bf16 or not fast
        assert ("linear: linear/dense_bf16_dot.c" in bf16 or "linear: linear/amx_gemm.c" in bf16) == fast
        kept = "amx_quant.c" if amx else "quant_bf16_dot.c" if fast else "quant_int8_rows.c"
        assert f"kept-quantized linear: linear/{kept}" in bf16
        attention = "amx_attention.c" if amx else "paged_avx512_bf16.c" if fast else "paged_fixed_order.c"
        assert f"attention: attention/{attention}" in bf16
        assert "norm, rotary, SiLU: ops/fused_torch_rounding.c" in bf16  # bf16's fused ops on every tier
        assert ("decoder loop: decoder/loop_avx512_bf16.c" if fast
                else "decoder loop: decoder/loop_portable.c (-DDECODER_BF16)") in bf16


def _rounded_rows(x: torch.Tensor, block: int) -> torch.Tensor:
    """x with each block of `block` inputs rounded as quant_int8_rows.c rounds it: d = max|x| / 127, rint(x / d) * d
    (float64). 32 inputs, or a K-quant's 256."""
    blocks = x.double().view(x.shape[0], -1, block)
    d = (blocks.abs().amax(-1, keepdim=True).float() / 127).double()
    inverse = torch.where(d > 0, (1 / d.float()).double(), 0)
    q = torch.round((blocks.float() * inverse.float()).double())
    return (q * d).view_as(x.double())


TIERS = tier_params("portable", "avx2", "avx512", "avx512_bf16", "amx")


@pytest.fixture(scope="module")
def products():
    """{(tier, qtype, n, k, dtype): output} filled as the tiers run, so that later tiers compare with earlier."""
    return {}


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("qtype,n,k", DOT_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_quant_dot_is_the_product_of_the_rounded_rows_the_same_on_every_tier(tier, qtype, n, k, dtype, products):
    weight, dequantized = quantized_weight(qtype, n, k, seed=n + k)
    # 41 rows: the AMX tier's K-quant tiles (24 rows and more) and its few-rows tile alike
    x = torch.randn(41, k, generator=torch.Generator().manual_seed(k)).to(dtype)
    bias = torch.randn(n, generator=torch.Generator().manual_seed(n))
    with forced_tier(tier):
        packed = quant_int8_rows.QuantDotWeight(weight)
        got = packed.matmul(x, bias)
        rows = packed.rows_of(torch.arange(n), torch.float32)
    assert got.dtype is dtype
    assert torch.equal(rows, dequantized)  # gguf-py's values exactly
    rounded = _rounded_rows(x.float(), 256 if qtype.endswith("_k") else 32)
    exact = rounded @ dequantized.double().T + bias.double()
    scale = rounded.abs() @ dequantized.double().abs().T + bias.double().abs()
    rounding = 2**-8 if dtype is torch.bfloat16 else 0
    assert torch.all((got.double() - exact).abs() <= exact.abs() * rounding + scale * 2**-16), (tier, qtype)
    # against the unrounded rows: what rounding each row to 8 bits per block (or super-block) costs
    dense = x.double() @ dequantized.double().T + bias.double()
    assert ((got.double() - dense).abs().max() / dense.abs().max()).item() < 0.02
    for earlier, value in products.items():
        if earlier[1:] == (qtype, n, k, dtype):
            assert torch.equal(value, got), (earlier[0], tier)
    products[(tier, qtype, n, k, dtype)] = got


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("qtype", FORMATS)
@pytest.mark.parametrize("n,k", [(1, 32), (17, 96), (100, 576), (70, 1536)])
def test_quant_f32_is_the_dense_kernel_on_the_dequantized_weights_to_the_bit(tier, qtype, n, k):
    weight, dequantized = quantized_weight(qtype, n, k, seed=n + k)
    bias = torch.randn(n, generator=torch.Generator().manual_seed(n))
    with forced_tier(tier):
        packed, dense = quant_exact_f32.QuantF32Weight(weight), dense_linear.GenericPanelWeight(dequantized)
        assert torch.equal(packed.rows_of(torch.arange(n)), dequantized)  # gguf-py's values exactly
        for m in (1, 2, 3, 7, 8, 9, 40):  # the few-rows tiles and the unpacked slabs
            x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
            assert torch.equal(packed.matmul(x, bias), dense.matmul(x, bias)), (tier, qtype, m)


@pytest.mark.parametrize("tier", tier_params("portable", "avx2", "avx512", "own"))
@pytest.mark.parametrize("qtype,kernel", [(qtype, quant_exact_f32.QuantF32Weight) for qtype in FORMATS]
                         + [(qtype, quant_int8_rows.QuantDotWeight)
                            for qtype in FORMATS + ["q5_0", "q5_1", "q4_k", "q5_k", "q6_k"]],
                         ids=lambda v: v if isinstance(v, str) else v.kernel.rpartition("/")[2])
def test_quantized_rows_do_not_depend_on_the_batch_or_the_threads(tier, qtype, kernel):
    n, k = 70, 512
    weight, _ = quantized_weight(qtype, n, k, seed=4)
    x = torch.randn(300, k, generator=torch.Generator().manual_seed(6))
    threads = torch.get_num_threads()
    with forced_tier(tier):
        packed = kernel(weight)
        alone = torch.cat([packed.matmul(x[i:i + 1]) for i in range(300)])
        try:
            for count in (1, 2):
                torch.set_num_threads(count)
                for m in (1, 2, 3, 4, 5, 7, 8, 13, 64, 65, 127, 300):
                    assert torch.equal(packed.matmul(x[:m]), alone[:m]), (tier, qtype, count, m)
        finally:
            torch.set_num_threads(threads)


@pytest.mark.parametrize("qtype", ["q4_0", "q5_0", "q8_0", "q4_k", "q6_k"])
def test_quant_dot_rounds_rows_with_nan_inf_zeros_and_denormals_the_same_on_every_tier(qtype):
    """The vectorized row rounding (and the AMX tier's tiles, from 24 rows) against the portable build's scalar
    loop on the inputs where a max, a division or a clamp could go another way."""
    n, k = 20, 512
    weight, _ = quantized_weight(qtype, n, k, seed=3)
    x = torch.randn(41, k, generator=torch.Generator().manual_seed(2))
    x[0, 5] = float("nan")
    x[1, 7] = float("inf")
    x[2] = 0.0
    x[3] = 1e-40  # denormal: its scale is denormal too
    x[4, 300] = float("-inf")
    x[5] *= 1e30
    x[6, 0] = -0.0
    results = {}
    for tier in tiers_here():
        with forced_tier(tier):
            results[tier] = quant_int8_rows.QuantDotWeight(weight).matmul(x)
    assert "portable" in results
    for tier, got in results.items():
        torch.testing.assert_close(got, results["portable"], rtol=0, atol=0, equal_nan=True, msg=tier)
    assert torch.isfinite(results["portable"][[2, 3, 5, 6]]).all()
