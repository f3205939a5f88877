"""The decoder layers run from C (decoder/loop_avx512_bf16.c for bf16, loop_portable.c for float32 on every
tier): the same tokens and logprobs, to the bit, as the module path, over chunked prefills, prefix-cache
hits, decodes and mixed steps; and the module path wherever the C loop would not compute exactly the same."""

import pytest
import torch

from tests.support.tiny_models import build_tiny_model
from engine_core.cpu_kernels.attention import paged_avx512_bf16
from engine_core.cpu_kernels.linear import dense_linear, quant_bf16_dot, quant_exact_f32
from engine_core.cpu_kernels.ops import fused_ops
from tests.support.cpu_tier_helpers import forced_tier, tier_params
from engine_core.cpu_kernels.decoder import loop_avx512_bf16, loop_portable
from tests.support.decoder_runs import greedy_run, random_prompts, runner_model

pytestmark = pytest.mark.integration
needs_c_decoder = pytest.mark.skipif(
    None in (loop_avx512_bf16.load(), dense_linear.load(), paged_avx512_bf16.load()) or not fused_ops.norm_kernel_ok(),
    reason="needs AVX512-BF16 and a C compiler: the C decoder's kernels do not run on this CPU")


@pytest.fixture(scope="module")
def qwen2_head32(tmp_path_factory, default_model_dir):
    # head_dim 32 (the kernels' smallest), biases on q, k, v
    return build_tiny_model(str(tmp_path_factory.mktemp("qwen2h32")), "qwen2", default_model_dir, hidden_size=128)


@pytest.fixture(scope="module")
def mistral_head32(tmp_path_factory, default_model_dir):
    # every layer slides (window 8: the prompts run to 90 tokens), head_dim 32
    return build_tiny_model(str(tmp_path_factory.mktemp("mistralh32")), "mistral", default_model_dir, hidden_size=128)


@pytest.fixture(scope="module")
def gemmas(tmp_path_factory, default_model_dir):
    """Gemma 2 (scores capped at a binding 2.0, alternating windows of 8) and Gemma 3 (q/k norms, 5 : 1 layers of
    windows of 8 with their own rotary base): every Gemma value the float32 loop runs, windows the prompts pass."""
    root = tmp_path_factory.mktemp("gemma-loop")
    return {"gemma2": build_tiny_model(str(root / "gemma2"), "gemma2", default_model_dir, sliding_window=8,
                                       num_hidden_layers=4),
            "gemma3": build_tiny_model(str(root / "gemma3"), "gemma3", default_model_dir, sliding_window=8,
                                       layer_types=["sliding_attention"] * 5 + ["full_attention"],
                                       num_hidden_layers=6)}


# default: the SmolLM2 GGUF's Q4_1 / Q8_0 weights kept quantized; -bf16: dequantized; -int8: per channel
@needs_c_decoder
@pytest.mark.parametrize("arch", ["default", "default-bf16", "qwen2", "qwen2-int8", "qwen3", "mistral"])
def test_the_c_loop_equals_the_modules_bit_for_bit(arch, default_model_dir, tiny_models, qwen2_head32, mistral_head32):
    path = {"default": default_model_dir, "default-bf16": default_model_dir, "qwen2": qwen2_head32,
            "qwen2-int8": qwen2_head32, "qwen3": tiny_models["qwen3"], "mistral": mistral_head32}[arch]
    quantization = {"default-bf16": "none", "qwen2-int8": "int8"}.get(arch, "auto")
    _check_c_loop(path, "bfloat16", quantization, loop_avx512_bf16.CpuDecoder, quant_bf16_dot.QuantPanelWeight,
                  arch in ("default", "qwen2-int8"), seed=1)


def _check_c_loop(path, dtype, quantization, loop, kept_type, kept, seed, storage=None):
    """The C loop `loop` runs the model (its first layer's weights kept quantized as `kept_type` exactly where
    `kept`; their panels in `storage` where given), and the modules give its tokens and logprobs to the bit."""
    from frontend.offline.llm import LLM
    # small steps: prompts are chunked, and chunks share steps with decodes
    llm = LLM(path, multiprocess=False, dtype=dtype, kv_cache_memory="64MiB", max_model_len=512,
              max_num_batched_tokens=48, quantization=quantization)
    try:
        model = runner_model(llm)
        assert isinstance(model.cpu_decoder, loop)
        assert isinstance(model.layers[0].self_attn.qkv_proj.packed_weight, kept_type) == kept
        assert storage is None or {m.packed_weight.storage for m in model.modules()
                                   if getattr(m, "packed_weight", None) is not None} == {storage}
        prompts = random_prompts(6, seed=seed)
        with_c = greedy_run(llm, prompts)
        llm.reset_prefix_cache()
        model.cpu_decoder = None
        assert greedy_run(llm, prompts) == with_c
        return with_c
    finally:
        llm.shutdown()


# float32 on every tier: default keeps the GGUF blocks (quant_exact_f32.c), -dense dequantizes (dense_fixed_order.c); llama's
# head_dim 16 takes the generic attention kernel too
@pytest.mark.skipif(loop_portable.load() is None, reason="no C compiler: the float32 C loop is not built")
@pytest.mark.parametrize("tier,arch", [
    *[pytest.param(p.values[0], arch, marks=p.marks, id=f"{p.values[0]}-{arch}") for p in tier_params("own", "avx2")
      for arch in ("default", "default-dense", "qwen2", "qwen2-int8", "qwen3", "llama", "mistral", "gemma2",
                   "gemma3")],
    *[pytest.param(p.values[0], arch, marks=p.marks, id=f"{p.values[0]}-{arch}") for p in tier_params("portable")
      for arch in ("qwen2-int8", "qwen3", "gemma2")]])
def test_the_float32_c_loop_equals_the_modules_bit_for_bit(tier, arch, default_model_dir, tiny_models, qwen2_head32,
                                                           mistral_head32, gemmas):
    path = {"default": default_model_dir, "default-dense": default_model_dir, "qwen2": qwen2_head32,
            "qwen2-int8": qwen2_head32, "qwen3": tiny_models["qwen3"], "llama": tiny_models["llama"],
            "mistral": mistral_head32, **gemmas}[arch]
    quantization = {"default-dense": "none", "qwen2-int8": "int8"}.get(arch, "auto")
    with forced_tier(tier):
        _check_c_loop(path, "float32", quantization, loop_portable.CpuDecoderF32, quant_exact_f32.QuantF32Weight,
                      arch in ("default", "qwen2-int8"), seed=2)


@pytest.fixture(scope="module")
def qwen3_bf16_checkpoint(tmp_path_factory, default_model_dir):
    return build_tiny_model(str(tmp_path_factory.mktemp("qwen3bf16")), "qwen3", default_model_dir,
                            save_dtype=torch.bfloat16)


@pytest.mark.skipif(loop_portable.load() is None, reason="no C compiler: the float32 C loop is not built")
@pytest.mark.parametrize("tier", tier_params("own", "avx2", "portable"))
def test_a_bf16_checkpoint_in_a_float32_engine_reads_bf16_panels_and_answers_as_float32_ones(
        tier, qwen3_bf16_checkpoint, monkeypatch):
    """Weights that are bf16 values are stored in bf16 panels (half the bytes) and widened as read: the C loop
    and the modules agree, and both give the float32 panels' tokens and logprobs to the bit."""
    from engine_core.cpu_kernels.linear import dense_linear
    loop, panels = loop_portable.CpuDecoderF32, dense_linear.GenericPanelWeight
    with forced_tier(tier):
        half = _check_c_loop(qwen3_bf16_checkpoint, "float32", "none", loop, panels, True, 3, torch.bfloat16)
        monkeypatch.setenv(dense_linear.BF16_STORAGE_ENV, "0")
        full = _check_c_loop(qwen3_bf16_checkpoint, "float32", "none", loop, panels, True, 3, torch.float32)
    assert half == full


def test_the_modules_run_where_the_c_loop_does_not_apply(tiny_models):
    from frontend.offline.llm import LLM
    # the C loops are the batch-invariant path's, in bf16 (on every tier) and in float32
    for path, dtype, invariant in ((tiny_models["llama"], "bfloat16", False), (tiny_models["qwen3"], "float32", False)):
        llm = LLM(path, multiprocess=False, dtype=dtype, kv_cache_memory="16MiB", max_model_len=256,
                  batch_invariant=invariant)
        try:
            assert runner_model(llm).cpu_decoder is None
            assert len(greedy_run(llm, [[5, 6, 7]])[0][0]) == 12
        finally:
            llm.shutdown()


# bf16 below avx512_bf16: the float32 loop's source built for bf16 (quant_int8_rows.c for the GGUF blocks,
# dense_fixed_order.c's bf16 panels, fused_torch_rounding.c's bf16 ops, the generic attention)
@pytest.mark.skipif(loop_portable.load_bf16() is None, reason="no C compiler: the generic bf16 C loop is not built")
@pytest.mark.parametrize("tier,arch", [
    *[pytest.param(p.values[0], arch, marks=p.marks, id=f"{p.values[0]}-{arch}") for p in tier_params("avx2")
      for arch in ("default", "default-dense", "qwen2", "qwen3", "llama", "mistral")],
    # portable runs the kept GGUF blocks in weights/test_k_quant_models.py's tiny file (SmolLM2 took over a minute)
    *[pytest.param(p.values[0], "qwen3", marks=p.marks, id=f"{p.values[0]}-qwen3") for p in tier_params("portable")]])
def test_the_generic_bf16_c_loop_equals_the_modules_bit_for_bit(tier, arch, default_model_dir, tiny_models,
                                                                  qwen2_head32, mistral_head32):
    from engine_core.cpu_kernels.linear import quant_int8_rows
    path = {"default": default_model_dir, "default-dense": default_model_dir, "qwen2": qwen2_head32,
            "qwen3": tiny_models["qwen3"], "llama": tiny_models["llama"], "mistral": mistral_head32}[arch]
    with forced_tier(tier):
        _check_c_loop(path, "bfloat16", "none" if arch == "default-dense" else "auto",
                      loop_portable.CpuDecoderBF16Generic, quant_int8_rows.QuantDotWeight, arch == "default", seed=4)
