"""Same request, same answer in bfloat16 on a CPU without AVX512-BF16 (simulated: the AVX512-BF16
kernels and the fused AVX512 ops switched off; and for real on the avx2 tier, NVLLM_CPU_ISA): the generic
fixed-order linear kernel, the kept-quantized quant_int8_rows.c, the generic attention kernel and the torch
norm/rotary/SiLU code with the fixed-order RMS statistic keep a request's tokens and logprobs bit-identical
alone, in a batch and under a 16-token budget."""

import pytest

from engine_core.attention.cpu_kernel_backend import CpuKernelAttentionBackend
from tests.support.cpu_tier_helpers import forced_tier, tier_params
from engine_core.cpu_kernels.linear import dense_linear, quant_int8_rows
from engine_core.cpu_kernels.ops import fused_ops
from tests.support.greedy_answers import PROMPTS, greedy_answers

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(dense_linear.load_fixed_order() is None, reason="no C compiler: the generic kernels are not built")]


@pytest.fixture
def no_avx512_bf16(monkeypatch):
    monkeypatch.setattr(dense_linear, "load", lambda: None)
    monkeypatch.setattr(fused_ops, "load", lambda: None)
    monkeypatch.setattr(CpuKernelAttentionBackend, "missing", classmethod(lambda cls: "simulated: no AVX512-BF16"))


def _engine(model, **args):
    from frontend.offline.llm import LLM
    return LLM(model, multiprocess=False, dtype="bfloat16", max_model_len=256, kv_cache_memory="16MiB", **args)


def test_bf16_without_avx512_bf16_answers_the_same_whatever_runs_beside_it(tiny_models, no_avx512_bf16):
    plain = _engine(tiny_models["llama"], enable_prefix_caching=False)
    try:
        runner = plain.client.core.executor.runner
        assert runner.backend.name == "cpu_generic"
        packed = {type(m.packed_weight) for m in runner.model.modules() if hasattr(m, "packed_weight")}
        assert packed == {dense_linear.GenericPanelWeight}
        alone = [greedy_answers(plain, [p])[0] for p in PROMPTS]
        assert greedy_answers(plain, PROMPTS) == alone
    finally:
        plain.shutdown()
    small_budget = _engine(tiny_models["llama"], enable_prefix_caching=True, max_num_batched_tokens=16)
    try:
        assert greedy_answers(small_budget, PROMPTS) == alone
        assert greedy_answers(small_budget, PROMPTS) == alone  # prefixes cached
    finally:
        small_budget.shutdown()


@pytest.mark.parametrize("cpu_tier", tier_params("avx2"))
def test_bf16_kept_quantized_on_the_avx2_tier_answers_the_same_whatever_runs_beside_it(default_model_dir, cpu_tier):
    """The default model in bf16 below avx512_bf16: its GGUF blocks through quant_int8_rows.c (8-bit input rows)."""
    with forced_tier(cpu_tier):
        plain = _engine(default_model_dir, enable_prefix_caching=False)
        try:
            packed = plain.client.core.executor.runner.model.layers[0].self_attn.qkv_proj.packed_weight
            assert isinstance(packed, quant_int8_rows.QuantDotWeight)
            alone = [greedy_answers(plain, [p])[0] for p in PROMPTS]
            assert greedy_answers(plain, PROMPTS) == alone
        finally:
            plain.shutdown()
        small_budget = _engine(default_model_dir, enable_prefix_caching=True, max_num_batched_tokens=16)
        try:
            assert greedy_answers(small_budget, PROMPTS) == alone
            assert greedy_answers(small_budget, PROMPTS) == alone  # prefixes cached
        finally:
            small_budget.shutdown()
