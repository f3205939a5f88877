"""Phi-3 / Phi-4-mini (fused q/k/v and gate/up, partial rotary, LongRoPE) and the YaRN / linear rope scalings:
float32 logits equal transformers' through the paged KV cache's paths, and greedy tokens through the engine.

LongRoPE's rule (layers/rotary.py): the long factors for every position where the engine's max_model_len passes
the original context, else the short ones. Short: equal to transformers; long: equal to transformers for a
prompt longer than the original context, and to transformers made to use its long factors for a shorter one.
"""

import math

import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from common.config import EngineArgs
from tests.support.tiny_models import build_tiny_model
from tests.support.cpu_tier_helpers import forced_tier, tier_params
from engine_core.engine_config import resolve_engine_config
from engine_core.families.catalog import read_spec
from engine_core.families.spec import UnsupportedConfig
from engine_core.cpu_kernels.ops import fused_ops
from engine_core.layers.rotary import RotaryEmbedding
from engine_core.weights.model_folder import read_hf_config
from engine_core.worker.model_runner import ModelRunner
from tests.support.preemption_check import assert_greedy_under_preemption
from tests.support.paged_kv_logits import (ATOL, BLOCK, TOKENS, check_chunked_prefill, check_decode_after_prefill,
                                           check_prefill, check_prefix_hit_and_mixed_batch, hf_logits, run_step)

pytestmark = pytest.mark.integration

ORIGINAL = 32  # LongRoPE's original context: TOKENS (23) fit in it
SHORT = [1.0 + 0.15 * i for i in range(6)]  # 12 rotated dims: 6 pairs
LONG = [1.5 + 2.0 * i for i in range(6)]

MODELS = {
    "phi3": dict(arch="phi3"),
    "phi3-longrope": dict(arch="phi3", partial_rotary_factor=0.75, tie_word_embeddings=True,
                          original_max_position_embeddings=ORIGINAL,
                          rope_scaling={"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG}),
    "llama-yarn": dict(arch="llama", rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                   "original_max_position_embeddings": 16}),
    "qwen3-yarn": dict(arch="qwen3", rope_scaling={"rope_type": "yarn", "factor": 2.0, "beta_fast": 16,
                                                   "beta_slow": 2, "mscale": 1.0, "mscale_all_dim": 0.5,
                                                   "truncate": False, "original_max_position_embeddings": 64}),
    "qwen2-yarn": dict(arch="qwen2", rope_scaling={"type": "yarn", "factor": 4.0,
                                                   "original_max_position_embeddings": 32}),  # Qwen2.5's form
    "llama-linear": dict(arch="llama", rope_scaling={"rope_type": "linear", "factor": 2.0}),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory, default_model_dir):
    root = tmp_path_factory.mktemp("phi3_rope")
    return {name: build_tiny_model(str(root / name), fields["arch"], default_model_dir,
                                   **{k: v for k, v in fields.items() if k != "arch"})
            for name, fields in MODELS.items()}


def make_runner(path: str, max_model_len: int | None = None) -> ModelRunner:
    args = EngineArgs(model=path, dtype="float32", device="cpu", block_size=BLOCK, kv_cache_memory="16MiB",
                      max_model_len=max_model_len)
    runner = ModelRunner(resolve_engine_config(args))
    runner.allocate_kv_cache(64)
    return runner


@pytest.fixture(scope="module", params=list(MODELS))
def pair(request, folders):
    path = folders[request.param]
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    # LongRoPE within its original context: the short factors, as transformers' for these lengths
    return make_runner(path, ORIGINAL if request.param == "phi3-longrope" else None), hf


# the logits comparisons of every family (test_model_vs_transformers.py's too), on this module's `pair`
def test_prefill(pair):
    check_prefill(pair)


def test_decode_after_prefill(pair):
    check_decode_after_prefill(pair)


def test_chunked_prefill(pair):
    check_chunked_prefill(pair)


def test_prefix_hit_and_mixed_batch(pair):
    check_prefix_hit_and_mixed_batch(pair)


# ---- LongRoPE past the original context ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def long_pair(folders):
    path = folders["phi3-longrope"]
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    return make_runner(path, max_model_len=128), hf


def test_longrope_past_the_original_context_takes_the_long_factors_for_a_long_prompt(long_pair):
    runner, hf = long_pair
    prompt = (TOKENS * 2)[:40]  # longer than the original 32: transformers takes the long factors too
    table = list(range(10))
    (ours,) = run_step(runner, [(prompt, 0, table)])
    torch.testing.assert_close(ours, hf_logits(hf, prompt), atol=ATOL, rtol=0)
    # chunked across the original length: every chunk rotates with the long factors, as one prefill does
    chunks = [run_step(runner, [(prompt[:end], start, table)])[0] for start, end in ((0, 20), (20, 40))]
    torch.testing.assert_close(torch.cat(chunks), hf_logits(hf, prompt), atol=ATOL, rtol=0)


def test_longrope_past_the_original_context_takes_the_long_factors_for_a_short_prompt_too(long_pair):
    """A token's rotation depends on the engine's max_model_len, not on its sequence's length so far."""
    runner, hf = long_pair
    rotary = hf.model.rotary_emb
    long_inv_freq, _ = ROPE_INIT_FUNCTIONS["longrope"](hf.config, None, seq_len=ORIGINAL + 1)
    short_inv_freq = rotary.original_inv_freq.clone()
    (ours,) = run_step(runner, [(TOKENS, 0, [5, 2, 9, 1, 7, 3])])
    assert not torch.allclose(ours, hf_logits(hf, TOKENS), atol=1e-3)  # transformers: the short factors
    try:
        rotary.original_inv_freq.copy_(long_inv_freq)
        torch.testing.assert_close(ours, hf_logits(hf, TOKENS), atol=ATOL, rtol=0)
    finally:
        rotary.original_inv_freq.copy_(short_inv_freq)


# ---- the one-call C decoder loop on each tier, with partial rotary -------------------------------------------

@pytest.mark.parametrize("cpu_tier", tier_params("own", "avx2", "portable"))
def test_partial_rotary_through_the_c_loop_on_each_tier(folders, cpu_tier):
    path = folders["phi3-longrope"]
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    with forced_tier(cpu_tier):
        runner = make_runner(path, ORIGINAL)
        assert runner.model.cpu_decoder is not None  # the C loop runs it, not the modules
        table = [3, 1, 4, 0, 5, 2]
        (ours,) = run_step(runner, [(TOKENS[:22], 0, table)])
        (last,) = run_step(runner, [(TOKENS, 22, table)])
    torch.testing.assert_close(torch.cat([ours, last]), hf_logits(hf, TOKENS), atol=ATOL, rtol=0)


@pytest.mark.parametrize("cpu_tier", tier_params("own", "portable"))
def test_the_bf16_c_loop_rotates_a_partial_head_as_the_modules_do(folders, cpu_tier):
    """bfloat16: the tier's C loop (loop_avx512_bf16.c on AVX512-BF16, else the generic one) gives the modules' tokens
    and logprobs to the bit, over chunked prefills, prefix-cache hits and decodes."""
    from frontend.offline.llm import LLM
    from tests.support.decoder_runs import greedy_run, random_prompts, runner_model

    with forced_tier(cpu_tier):
        llm = LLM(folders["phi3-longrope"], multiprocess=False, dtype="bfloat16", kv_cache_memory="64MiB",
                  max_model_len=128, max_num_batched_tokens=32)
        try:
            model = runner_model(llm)
            if model.cpu_decoder is None:
                pytest.skip("no bf16 C loop on this tier")
            prompts = random_prompts(3, seed=5)
            with_c = greedy_run(llm, prompts)
            llm.reset_prefix_cache()
            model.cpu_decoder = None
            assert greedy_run(llm, prompts) == with_c
        finally:
            llm.shutdown()


@pytest.mark.parametrize("cpu_tier", tier_params("own", "avx2", "portable"))
def test_bf16_rotary_kernel_rotates_only_the_leading_dims(cpu_tier):
    """fused_ops' fused kernel (bf16, in place) equals the module's torch path with 12 of 16 dims rotated."""
    rotary = RotaryEmbedding(16, 64, 10000.0, rotary_dim=12)
    heads = torch.randn(5, 3, 16).to(torch.bfloat16)
    positions = torch.tensor([0, 7, 31, 2, 63])
    tables = rotary._tables_for(positions, torch.bfloat16)
    lead = heads[..., :12]
    rotated = lead * tables.cos + torch.cat([-lead[..., 6:], lead[..., :6]], -1) * tables.sin
    expected = torch.cat([rotated, heads[..., 12:]], -1)
    with forced_tier(cpu_tier):
        got = heads.clone()
        if not fused_ops.rotary(positions, got, rotary.cos, rotary.sin):
            pytest.skip("no fused rotary kernel on this tier")
    assert torch.equal(got, expected)


# ---- through the whole engine ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["phi3-longrope", "llama-yarn"])
def test_greedy_generate_with_preemption_matches(folders, name):
    """Four requests of up to 14 + 16 tokens (8 blocks each) in a pool of 12 blocks: preempted and recomputed,
    they still give transformers' tokens (within LongRoPE's original context, so both pick the short factors)."""
    prompts = [TOKENS[:9], TOKENS[3:15], TOKENS[5:11], TOKENS[:14]]
    assert_greedy_under_preemption(folders[name], prompts, blocks=12, max_tokens=16, max_model_len=ORIGINAL)


# ---- reading the config ----------------------------------------------------------------------------------------

def test_phi3_config_reads(folders):
    spec = read_spec(read_hf_config(folders["phi3-longrope"]))
    assert (spec.family, spec.head_dim, spec.rope.rotary_dim, spec.tie_word_embeddings) == ("phi3", 16, 12, True)
    assert spec.rope.scaling["rope_type"] == "longrope"
    assert spec.rope.scaling["original_max_position_embeddings"] == ORIGINAL


def _config(folder: str, **changes) -> dict:
    return read_hf_config(folder) | changes


@pytest.mark.parametrize("changes, field", [
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope_scaling.rope_type"),
    ({"rope_scaling": {"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG, "short_mscale": 1.1}},
     "rope_scaling.short_mscale"),
    ({"rope_scaling": {"rope_type": "longrope", "short_factor": SHORT[:4], "long_factor": LONG}},
     "rope_scaling.short_factor"),
])
def test_phi3_refuses_by_name(folders, changes, field):
    with pytest.raises(UnsupportedConfig) as refused:
        read_spec(_config(folders["phi3"], **changes))
    assert refused.value.field == field


def test_phi4_mini_fields_transformers_phi3_never_reads_are_ignored(folders):
    # Phi-4-mini's config.json names these for its own modeling code; transformers' Phi3ForCausalLM reads none of
    # them (no biases, every layer alike), so neither does nvllm, at any value
    fields = dict(attention_bias=False, mlp_bias=False, lm_head_bias=False, full_attn_mod=1, interpolate_factor=1)
    spec = read_spec(_config(folders["phi3"], **fields))
    assert spec == read_spec(_config(folders["phi3"])) and not spec.qkv_bias and not spec.mlp_bias
    assert read_spec(_config(folders["phi3"], **(fields | {"full_attn_mod": 2, "attention_bias": True}))) == spec


def test_a_window_that_never_binds_and_older_rope_names_are_read(folders):
    spec = read_spec(_config(folders["phi3"], sliding_window=512,
                             rope_scaling={"type": "su", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8}))
    assert spec.layer_windows == () and spec.rope.scaling["rope_type"] == "longrope"
    # one that binds within max_position_embeddings 512 slides every layer, as transformers' Phi3
    spec = read_spec(_config(folders["phi3"], sliding_window=256))
    assert spec.layer_windows == (256,) * spec.num_layers and spec.every_layer_slides


def test_partial_rotary_is_refused_where_the_family_rotates_whole_heads(folders):
    with pytest.raises(UnsupportedConfig, match="partial_rotary_factor"):
        read_spec(_config(folders["llama-yarn"], rope_scaling={"rope_type": "linear", "factor": 2.0,
                                                               "partial_rotary_factor": 0.5}))


# ---- llama.cpp's phi3 GGUF ---------------------------------------------------------------------------------------

def _write_phi3_gguf(path: str, seed: int = 0) -> tuple[dict, dict]:
    """A random Phi-4-mini-shaped model as llama.cpp's converter writes it (fused attn_qkv, ffn_up holding gate;up
    in Q8_0, rope_factors_long / rope_factors_short, rope.dimension_count the rotated dims, tied embeddings).
    Returns its HF (Phi3ForCausalLM) float32 state dict and config fields."""
    import gguf
    import numpy as np
    from tests.support.gguf_writing import add_tiny_tokenizer

    heads, kv, head_dim, hidden, inter, layers, context = 4, 2, 16, 64, 48, 2, 128
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(path, "phi3")
    vocab = add_tiny_tokenizer(writer)
    writer.add_context_length(context)
    writer.add_rope_scaling_orig_ctx_len(ORIGINAL)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(inter)
    writer.add_block_count(layers)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(12)
    writer.add_rope_freq_base(10000.0)
    writer.add_sliding_window(0)
    writer.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(context / ORIGINAL) / math.log(ORIGINAL)))
    state = {}

    def add(gguf_name, hf_name, shape, q8=False):
        w = rng.standard_normal(shape).astype(np.float32) * (0.2 if len(shape) == 2 else 1.0)
        if q8:
            q = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(gguf_name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            w = gguf.quants.dequantize(q, gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(gguf_name, w)
        state[hf_name] = torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32))

    add("token_embd.weight", "model.embed_tokens.weight", (vocab, hidden))
    for i in range(layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        add(b + "attn_norm.weight", p + "input_layernorm.weight", (hidden,))
        add(b + "attn_qkv.weight", p + "self_attn.qkv_proj.weight", ((heads + 2 * kv) * head_dim, hidden))
        add(b + "attn_output.weight", p + "self_attn.o_proj.weight", (hidden, heads * head_dim))
        add(b + "ffn_norm.weight", p + "post_attention_layernorm.weight", (hidden,))
        add(b + "ffn_up.weight", p + "mlp.gate_up_proj.weight", (2 * inter, hidden), q8=True)
        add(b + "ffn_down.weight", p + "mlp.down_proj.weight", (hidden, inter))
    add("output_norm.weight", "model.norm.weight", (hidden,))
    writer.add_tensor("rope_factors_long.weight", np.array(LONG, dtype=np.float32))
    writer.add_tensor("rope_factors_short.weight", np.array(SHORT, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    fields = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=context,
                  original_max_position_embeddings=ORIGINAL, partial_rotary_factor=0.75, rms_norm_eps=1e-5,
                  tie_word_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                  rope_scaling={"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG})
    return state, fields


def test_phi3_gguf_imports_as_transformers_runs_it(tmp_path):
    from engine_core.weights.gguf_import import import_gguf

    gguf_path = str(tmp_path / "tiny-phi3.gguf")
    state, fields = _write_phi3_gguf(gguf_path)
    folder = import_gguf(gguf_path, str(tmp_path / "out"))
    spec = read_spec(read_hf_config(folder))
    assert (spec.family, spec.head_dim, spec.rope.rotary_dim, spec.layer_windows) == ("phi3", 16, 12, ())
    as_stored = {key: torch.tensor(values).tolist() for key, values in (("short_factor", SHORT), ("long_factor", LONG))}
    assert {key: spec.rope.scaling[key] for key in as_stored} == as_stored  # float32 in the file
    hf = transformers.Phi3ForCausalLM(transformers.Phi3Config(**fields)).eval()
    hf.load_state_dict(state, strict=False)  # lm_head: tied to the embeddings
    tokens = [t % fields["vocab_size"] for t in TOKENS]
    for quantization in ("none", "gguf"):  # dequantized; the Q8_0 gate;up rows kept as blocks, split
        args = EngineArgs(model=folder, dtype="float32", device="cpu", block_size=BLOCK, kv_cache_memory="16MiB",
                          max_model_len=ORIGINAL, quantization=quantization)
        runner = ModelRunner(resolve_engine_config(args))
        runner.allocate_kv_cache(64)
        (ours,) = run_step(runner, [(tokens, 0, [5, 2, 9, 1, 7, 3])])
        torch.testing.assert_close(ours, hf_logits(hf, tokens), atol=ATOL if quantization == "none" else 1e-3,
                                   rtol=0)


def test_a_yarn_gguf_names_its_ramp_bounds():
    from engine_core.weights.gguf_import import _rope_scaling

    class Meta:
        values = {"qwen3.rope.scaling.type": "yarn", "qwen3.rope.scaling.factor": 4.0,
                  "qwen3.rope.scaling.original_context_length": 32768, "qwen3.rope.scaling.yarn_beta_fast": 16.0}

        def get(self, key, default=None):
            return self.values.get(key, default)

    assert _rope_scaling(Meta(), "qwen3") == {"rope_type": "yarn", "factor": 4.0, "beta_fast": 16.0,
                                              "original_max_position_embeddings": 32768}
