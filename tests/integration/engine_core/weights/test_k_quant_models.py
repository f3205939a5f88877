"""GGUF files as people download them (Q4_K_M-style mixes of Q4_K, Q5_K, Q6_K, Q5_0, Q5_1 and Q8_0 tensors) run
with their weights kept quantized: a tiny random Qwen2 file written here is imported once, each linear layer keeps
its file's type (quant_int8_rows.c for the types only it takes), and the kept engine's first-token logprobs are the
dequantized model's (the file's exact values) within the 8-bit activation rounding, in float32 and bfloat16."""

import numpy as np
import pytest
import torch

from common.sampling_params import SamplingParams
from tests.support.cpu_tier_helpers import forced_tier, tier_params
from engine_core.cpu_kernels.linear import quant_int8_rows
from engine_core.layers.quant_pieces import PiecewiseQuantWeight
from tests.support.gguf_weights import gguf_rows
from tests.support.gguf_writing import add_tiny_tokenizer

pytestmark = pytest.mark.integration

HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM, LAYERS = 256, 512, 4, 2, 64, 2
# tensor -> type per layer, as llama.cpp's Q4_K_M mixes them (and the other kept types, one layer each)
LAYER_TYPES = [
    {"attn_q": "q4_k", "attn_k": "q4_k", "attn_v": "q6_k", "attn_output": "q4_k", "ffn_gate": "q4_k",
     "ffn_up": "q4_k", "ffn_down": "q6_k"},
    {"attn_q": "q5_k", "attn_k": "q5_k", "attn_v": "q5_0", "attn_output": "q5_1", "ffn_gate": "q5_0",
     "ffn_up": "q5_0", "ffn_down": "q8_0"},
]
PROMPTS = ["hello", "hell hell", "lo he", "ehlo", "the hello", "oh hell"]


def _shape(name: str) -> tuple[int, int]:
    return {"attn_q": (HEADS * HEAD_DIM, HIDDEN), "attn_k": (KV_HEADS * HEAD_DIM, HIDDEN),
            "attn_v": (KV_HEADS * HEAD_DIM, HIDDEN), "attn_output": (HIDDEN, HEADS * HEAD_DIM),
            "ffn_gate": (INTER, HIDDEN), "ffn_up": (INTER, HIDDEN), "ffn_down": (HIDDEN, INTER)}[name]


@pytest.fixture(scope="module")
def k_quant_gguf(tmp_path_factory) -> str:
    import gguf

    path = str(tmp_path_factory.mktemp("kquant") / "tiny-q4_k_m.gguf")
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(path, "qwen2")
    vocab = add_tiny_tokenizer(writer)
    for key, value in (("block_count", LAYERS), ("context_length", 256), ("embedding_length", HIDDEN),
                       ("feed_forward_length", INTER), ("head_count", HEADS), ("head_count_kv", KV_HEADS)):
        getattr(writer, f"add_{key}")(value)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_vocab_size(vocab)

    def quantized(name: str, qtype: str, shape: tuple[int, int], seed: int, size: float = 0.05) -> None:
        raw = gguf_rows(qtype, *shape, seed=seed, size=size)
        writer.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=gguf.GGMLQuantizationType[qtype.upper()])

    def plain(name: str, shape: tuple[int, ...], size: float) -> None:
        writer.add_tensor(name, (size * rng.standard_normal(shape)).astype(np.float32))

    # tied: the head reads it too, and its size makes logits of a few units (answers far from ties, mostly)
    quantized("token_embd.weight", "q8_0", (vocab, HIDDEN), seed=1, size=0.3)
    for i, types in enumerate(LAYER_TYPES):
        plain(f"blk.{i}.attn_norm.weight", (HIDDEN,), 1.0)
        plain(f"blk.{i}.ffn_norm.weight", (HIDDEN,), 1.0)
        for name, qtype in types.items():
            quantized(f"blk.{i}.{name}.weight", qtype, _shape(name), seed=10 * i + len(name))
        for name in ("attn_q", "attn_k", "attn_v"):
            plain(f"blk.{i}.{name}.bias", (_shape(name)[0],), 0.1)
    plain("output_norm.weight", (HIDDEN,), 1.0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _first_token_logprobs(path: str, quantization: str, dtype: str):
    """What the load made of the layers, and each prompt's first-token logprobs {token: logprob} (top 20)."""
    from frontend.offline.llm import LLM

    llm = LLM(path, multiprocess=False, dtype=dtype, quantization=quantization, kv_cache_memory="16MiB",
              max_model_len=256, enable_prefix_caching=False)
    try:
        runner = llm.client.core.executor.runner
        layers = {name: type(m.packed_weight) for name, m in runner.model.named_modules()
                  if getattr(m, "packed_weight", None) is not None}
        params = SamplingParams(temperature=0, max_tokens=1, logprobs=20)
        outs = llm.generate(PROMPTS, params, use_tqdm=False)
        return runner.quantization, layers, [{t: lp.logprob for t, lp in o.outputs[0].logprobs[0].items()}
                                             for o in outs]
    finally:
        llm.shutdown()


@pytest.mark.skipif(quant_int8_rows.load() is None, reason="no C compiler: quant_int8_rows.c is not built")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_k_quant_mix_stays_quantized_and_answers_as_the_dequantized_model(k_quant_gguf, dtype):
    what, layers, kept = _first_token_logprobs(k_quant_gguf, "gguf", dtype)
    # each layer keeps its file's types, a fused one whose pieces differ (q, k Q4_K; v Q6_K) piece by piece
    assert what == ("2 layers q4_k, 1 layers q4_k+q6_k, 1 layers q5_0, 1 layers q5_1, 1 layers q5_k+q5_0, "
                    "1 layers q6_k, 2 layers q8_0"), what
    assert layers["layers.0.mlp.gate_up_proj"] is quant_int8_rows.QuantDotWeight, layers
    assert layers["layers.0.mlp.down_proj"] is quant_int8_rows.QuantDotWeight
    assert layers["layers.0.self_attn.qkv_proj"] is PiecewiseQuantWeight
    what, _, dense = _first_token_logprobs(k_quant_gguf, "none", dtype)
    assert what == "none"
    # quant_int8_rows.c rounds each activation row to 8 bits per block of 32, per 256 for K-quants (llama.cpp's numerics):
    # logprobs move by a few hundredths (measured: mean 0.08, largest 0.46 over 6 prompts x 20 tokens, 2 random layers); a piece in
    # the wrong place or a misread block would move them by units
    diffs = [abs(a[t] - b[t]) for a, b in zip(kept, dense) for t in a if t in b]
    assert len(diffs) >= 6 * 15
    assert sum(diffs) / len(diffs) < 0.15 and max(diffs) < 0.75, (sum(diffs) / len(diffs), max(diffs))
    assert sum(max(a, key=a.get) == max(b, key=b.get) for a, b in zip(kept, dense)) >= 4  # the same first token


@pytest.mark.skipif(quant_int8_rows.load() is None, reason="no C compiler: quant_int8_rows.c is not built")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_auto_keeps_every_type_a_kernel_takes(k_quant_gguf, dtype):
    """float32 and bf16 engines alike keep every type (kept layers decode faster than their dequantized copies on
    every tier measured: docs/models/gguf.md)."""
    what, layers, _ = _first_token_logprobs(k_quant_gguf, "auto", dtype)
    assert what.count("layers") == 7, what
    assert layers["layers.0.mlp.gate_up_proj"] is quant_int8_rows.QuantDotWeight


def _c_loop_and_modules(path: str, dtype: str):
    """The C decoder loop the engine picked for the kept mix, and the greedy tokens and logprobs of chunked
    prompts (prefix-cache hits among them) with it and with the modules."""
    from frontend.offline.llm import LLM

    llm = LLM(path, multiprocess=False, dtype=dtype, quantization="gguf", kv_cache_memory="16MiB",
              max_model_len=256, max_num_batched_tokens=16)
    try:
        model = llm.client.core.executor.runner.model
        loop = model.cpu_decoder
        params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=3)
        prompts = [p * 4 for p in PROMPTS] + [PROMPTS[0] * 4 + PROMPTS[1] * 4]

        def run():
            return [(o.outputs[0].token_ids, o.outputs[0].logprobs)
                    for o in llm.generate(prompts, params, use_tqdm=False)]
        with_loop = run()
        llm.reset_prefix_cache()
        model.cpu_decoder = None
        return loop, with_loop, run()
    finally:
        llm.shutdown()


@pytest.mark.skipif(quant_int8_rows.load() is None, reason="no C compiler: quant_int8_rows.c is not built")
@pytest.mark.parametrize("tier,dtype", [
    *[pytest.param(p.values[0], dtype, marks=p.marks, id=f"{p.values[0]}-{dtype}")
      for p in tier_params("own", "avx2") for dtype in ("float32", "bfloat16")],
    *[pytest.param(p.values[0], "bfloat16", marks=p.marks, id=f"{p.values[0]}-bfloat16") for p in tier_params("portable")]])
def test_the_c_decoder_loops_run_the_kept_mix_as_the_modules_do(k_quant_gguf, tier, dtype):
    """Kept K-quant layers and fused layers of mixed types (pieces) run in the one-call C loops, bit for bit as the
    modules run them, in float32 and bf16, on the machine's tier and on AVX2 (and portable C, in bf16: the generic
    bf16 loop with quant_int8_rows.c's plain-C tiles)."""
    from engine_core.cpu_kernels.decoder import loop_avx512_bf16
    from engine_core.cpu_kernels.decoder import loop_portable

    with forced_tier(tier):
        loop, with_loop, with_modules = _c_loop_and_modules(k_quant_gguf, dtype)
        if dtype == "float32":
            expected = loop_portable.CpuDecoderF32
        else:  # loop_avx512_bf16.c where its kernels run (avx512_bf16 and up)
            expected = loop_avx512_bf16.CpuDecoder if loop_avx512_bf16.load() is not None else loop_portable.CpuDecoderBF16Generic
    assert type(loop) is expected, (type(loop), expected)
    assert with_loop == with_modules
