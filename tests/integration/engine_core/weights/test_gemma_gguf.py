"""Gemma 2 and Gemma 3 GGUFs as llama.cpp writes them (architectures gemma2, gemma3): written here from tiny
transformers Gemma2ForCausalLM / Gemma3ForCausalLM models the way llama.cpp's converter does (every norm weight + 1,
its tensor names and metadata keys, tied embeddings, no sliding-pattern key; Gemma 2's soft caps, no rotary base),
imported, and run: logits and greedy tokens equal transformers' on the model the file came from; a Q8_0 projection
stays quantized; the config reads the window, the layer pattern, the caps and the rotary bases."""

import json
import os

import msgspec
import numpy as np
import pytest
import torch
import transformers
from safetensors.torch import load_file

from common.config import EngineArgs
from tests.support.tiny_models import build_tiny_model
from engine_core.engine_config import resolve_engine_config
from engine_core.families.catalog import read_spec
from engine_core.weights.gguf_gemma import gemma_fields
from engine_core.weights.gguf_import import import_gguf
from engine_core.weights.loader import quantized_tensors
from engine_core.weights.model_folder import read_hf_config
from engine_core.worker.model_runner import ModelRunner
from tests.support.gguf_writing import add_tensor, add_tiny_tokenizer
from tests.support.paged_kv_logits import hf_logits, make_runner, run_step

pytestmark = pytest.mark.integration

VOCAB = 261  # add_tiny_tokenizer's
LAYERS = 6  # one whole Gemma 3 sliding pattern (five sliding layers, then a global one); three Gemma 2 pairs
WINDOW = 4  # smaller than the prompts: the sliding layers slide
TOKENS = [5, 200, 17, 260, 31, 99, 3, 150, 42, 77, 8, 180, 64]
# HF name piece -> llama.cpp's gemma2 / gemma3 name, per layer
_LAYER_NAMES = {"input_layernorm": "attn_norm", "post_attention_layernorm": "post_attention_norm",
                "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm",
                "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
                "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                "mlp.down_proj": "ffn_down"}


def write_gemma_gguf(hf_folder: str, path: str, q8: bool = False) -> None:
    """The HF checkpoint at `hf_folder` (Gemma 2 or 3, as its config says) as llama.cpp's converter writes it; q8:
    every matrix Q8_0 (the projections and the tied embeddings)."""
    import gguf

    with open(os.path.join(hf_folder, "config.json")) as f:
        config = json.load(f)
    arch = "gemma2" if config["model_type"] == "gemma2" else "gemma3"
    tensors = {k.removeprefix("model."): v.numpy() for k, v in load_file(f"{hf_folder}/model.safetensors").items()}
    writer = gguf.GGUFWriter(path, arch)
    add_tiny_tokenizer(writer)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_key_length(config["head_dim"])
    writer.add_value_length(config["head_dim"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_sliding_window(config["sliding_window"])
    if arch == "gemma2":  # its caps; no rotary base (llama.cpp's default 10000 is Gemma 2's)
        writer.add_attn_logit_softcapping(config["attn_logit_softcapping"])
        writer.add_final_logit_softcapping(config["final_logit_softcapping"])
    else:
        writer.add_rope_freq_base(config["rope_parameters"]["full_attention"]["rope_theta"])
        full_rope = config["rope_parameters"]["full_attention"]
        if full_rope.get("rope_type") == "linear":  # the converter's rope.scaling keys (the global layers' scaling)
            writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            writer.add_rope_scaling_factor(full_rope["factor"])

    def add(gguf_name, values):
        if gguf_name.endswith("norm.weight"):
            values = values + np.float32(1.0)  # llama.cpp's RMSNorm scales by the weight, Gemma's by 1 + weight
        add_tensor(writer, gguf_name, values, q8 and values.ndim == 2)  # the projections and the (tied) embeddings

    add("token_embd.weight", tensors.pop("embed_tokens.weight"))
    add("output_norm.weight", tensors.pop("norm.weight"))
    tensors.pop("lm_head.weight", None)  # tied: the converter writes no output tensor
    for key in sorted(tensors):
        _, layer, rest = key.split(".", 2)
        piece, _, suffix = rest.rpartition(".")
        add(f"blk.{layer}.{_LAYER_NAMES[piece]}.{suffix}", tensors[key])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


# each generation's sliding layers; Gemma 2 alternates, the first layer sliding (llama.cpp's fixed patterns)
_KINDS = {"gemma3": ["sliding_attention"] * 5 + ["full_attention"],
          "gemma2": ["sliding_attention", "full_attention"] * 3}


@pytest.fixture(scope="module", params=["gemma3", "gemma2"])
def hf_folder(request, tmp_path_factory, default_model_dir):
    # head_dim 16 = query_pre_attn_scalar, as the released checkpoints but each 27B (llama.cpp's rule: gguf_gemma.py)
    arch = request.param
    return build_tiny_model(str(tmp_path_factory.mktemp(f"{arch}-gguf") / "hf"), arch, default_model_dir,
                            vocab_size=VOCAB, num_hidden_layers=LAYERS, tie_word_embeddings=True,
                            query_pre_attn_scalar=16, sliding_window=WINDOW, layer_types=_KINDS[arch])


@pytest.fixture(scope="module")
def imported(hf_folder, tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma-gguf-import")
    write_gemma_gguf(hf_folder, str(root / "g.gguf"))
    return import_gguf(str(root / "g.gguf"), str(root / "imported"))


@pytest.fixture(scope="module")
def hf(hf_folder):
    return transformers.AutoModelForCausalLM.from_pretrained(hf_folder, dtype=torch.float32).eval()


def test_the_config_reads_the_window_the_pattern_the_caps_and_the_rotary_bases(imported, hf_folder):
    config = read_hf_config(imported)
    spec = read_spec(config)
    assert config["tie_word_embeddings"]
    if spec.family == "gemma3":
        assert config["model_type"] == "gemma3_text"
        assert spec.layer_windows == (WINDOW,) * 5 + (None,)
        assert [spec.rope_theta(i) for i in (0, 5)] == [10000.0, 1000000.0]
        assert (spec.attn_logit_softcap, spec.final_logit_softcap) == (None, None)
    else:
        assert config["model_type"] == "gemma2"
        assert spec.layer_windows == (WINDOW, None) * 3
        assert [spec.rope_theta(i) for i in (0, 1)] == [10000.0, 10000.0]
        assert (spec.attn_logit_softcap, spec.final_logit_softcap) == (2.0, 5.0)  # the test model's binding caps
    assert spec.attn_scale == 16 ** -0.5 and spec.norm_offset == 1.0 and spec.activation == "gelu_tanh"
    # the file keeps rms_norm_eps as a float32: everything else as the checkpoint's config says
    from_hf = read_spec(read_hf_config(hf_folder))
    assert spec.norm_eps == pytest.approx(from_hf.norm_eps, rel=1e-6)
    assert spec == msgspec.structs.replace(from_hf, norm_eps=spec.norm_eps)


@pytest.mark.parametrize("arch, layers, scalar", [("gemma2", 26, 256), ("gemma2", 46, 144), ("gemma3", 26, 256),
                                                  ("gemma3", 62, 168)])
def test_llama_cpps_attention_scale_rule(arch, layers, scalar):
    """head_dim, except each generation's 27B (46 and 62 layers), whose scale is hidden / heads: the values the
    released config.json files name (Gemma 2 2B, 27B; Gemma 3 1B, 27B)."""
    hidden, heads = (4608, 32) if layers == 46 else (5376, 32) if layers == 62 else (2304, 8)
    config = {"num_hidden_layers": layers, "head_dim": 256, "hidden_size": hidden, "num_attention_heads": heads,
              "rope_theta": 10000.0}
    fields = gemma_fields(arch, config, lambda name: {"attention.sliding_window": 4096}.get(name))
    assert fields["query_pre_attn_scalar"] == scalar


def test_a_gemma2_file_without_caps_or_window_takes_llama_cpps_defaults():
    config = {"num_hidden_layers": 4, "head_dim": 16, "hidden_size": 64, "num_attention_heads": 4,
              "rope_theta": 10000.0}
    fields = gemma_fields("gemma2", config, lambda name: None)
    assert (fields["attn_logit_softcapping"], fields["final_logit_softcapping"], fields["sliding_window"]) == (
        50.0, 30.0, 4096)
    assert fields["layer_types"] == ["sliding_attention", "full_attention"] * 2
    with pytest.raises(ValueError, match="rope.scaling"):
        gemma_fields("gemma2", config | {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, lambda name: None)


def test_norms_are_hfs_values(imported, hf_folder):
    """The converter's + 1 is taken off again: every weight equals the checkpoint's (to float32 rounding)."""
    ours = load_file(os.path.join(imported, "model.safetensors"))
    theirs = load_file(os.path.join(hf_folder, "model.safetensors"))
    theirs.pop("lm_head.weight", None)
    assert sorted(ours) == sorted(theirs)
    for name, value in theirs.items():
        torch.testing.assert_close(ours[name], value, atol=1e-6, rtol=0, msg=name)


def test_what_transformers_own_gguf_loader_reads(imported):
    """transformers' GGUF loader (from_pretrained(gguf_file=...)) reads the same file to the same weights, bit for
    bit, and the same window, activation and head size (and Gemma 3's layer types and rotary bases); its
    query_pre_attn_scalar is the config class's default 256 where nvllm takes llama.cpp's rule (head_dim:
    weights/gguf_gemma.py)."""
    folder = os.path.dirname(imported)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file="g.gguf", dtype=torch.float32)
    ours = load_file(os.path.join(imported, "model.safetensors"))
    state = theirs.state_dict()
    assert sorted(ours) == sorted(k for k in state if k != "lm_head.weight")  # tied
    assert all(torch.equal(ours[name], state[name]) for name in ours)
    config = read_hf_config(imported)
    fields = ["sliding_window", "hidden_activation", "head_dim"]
    if config["model_type"] == "gemma3_text":  # transformers' gemma2 loader leaves both at its class defaults
        fields += ["layer_types", "rope_parameters"]
    for field in fields:
        assert config[field] == getattr(theirs.config, field), field
    assert (config["query_pre_attn_scalar"], theirs.config.query_pre_attn_scalar) == (16, 256)


def test_logits_equal_transformers(imported, hf):
    (ours,) = run_step(make_runner(imported), [(TOKENS, 0, [3, 1, 2, 0])])
    torch.testing.assert_close(ours, hf_logits(hf, TOKENS), atol=1e-4, rtol=0)


def test_greedy_tokens_through_the_engine_equal_transformers(imported, hf):
    from frontend import LLM, SamplingParams

    prompts = [TOKENS, TOKENS[2:9]]
    expected = []
    for prompt in prompts:
        with torch.no_grad():
            out = hf.generate(torch.tensor([prompt]), max_new_tokens=10, min_new_tokens=10, do_sample=False)
        expected.append(out[0, len(prompt):].tolist())
    llm = LLM(imported, dtype="float32", block_size=4, max_model_len=64, kv_cache_memory="16MiB")
    try:
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True), use_tqdm=False)
    finally:
        llm.shutdown()
    assert [o.outputs[0].token_ids for o in outs] == expected


def test_q8_0_projections_stay_quantized(hf_folder, tmp_path):
    write_gemma_gguf(hf_folder, str(tmp_path / "q.gguf"), q8=True)
    folder = import_gguf(str(tmp_path / "q.gguf"), str(tmp_path / "imported"))
    kept = quantized_tensors(folder)
    assert sorted(kept) == sorted(["model.embed_tokens.weight"] + [
        f"model.layers.{i}.{p}.weight" for i in range(LAYERS) for p in (
            "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
            "mlp.up_proj", "mlp.down_proj")])
    dequantized = ModelRunner(resolve_engine_config(EngineArgs(model=folder, dtype="float32", device="cpu",
                                                               block_size=4, kv_cache_memory="16MiB",
                                                               quantization="none")))
    dequantized.allocate_kv_cache(64)
    quantized = make_runner(folder)  # quantization auto: kept where a kernel takes them
    assert quantized.quantization == "25 layers q8_0"  # 6 x (qkv, o, gate/up, down) and the tied embeddings
    (kept_logits,) = run_step(quantized, [(TOKENS, 0, [3, 1, 2, 0])])
    (float_logits,) = run_step(dequantized, [(TOKENS, 0, [3, 1, 2, 0])])
    torch.testing.assert_close(kept_logits, float_logits, atol=1e-4, rtol=0)


def test_a_linearly_scaled_global_rotary_equals_transformers(default_model_dir, tmp_path):
    """The 4B and larger files carry rope.scaling (linear, factor 8) for the global layers only (the sliding ones
    rotate unscaled): read into rope_parameters.full_attention, it gives transformers' logits."""
    rope = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}}
    hf_folder = build_tiny_model(str(tmp_path / "hf"), "gemma3", default_model_dir, vocab_size=VOCAB,
                                 num_hidden_layers=LAYERS, tie_word_embeddings=True, query_pre_attn_scalar=16,
                                 sliding_window=WINDOW, layer_types=["sliding_attention"] * 5 + ["full_attention"],
                                 rope_parameters=rope)
    write_gemma_gguf(hf_folder, str(tmp_path / "s.gguf"))
    folder = import_gguf(str(tmp_path / "s.gguf"), str(tmp_path / "imported"))
    config = read_hf_config(folder)
    assert config["rope_parameters"]["full_attention"] == {"rope_type": "linear", "rope_theta": 1000000.0,
                                                           "factor": 8.0}
    spec = read_spec(config)
    assert [spec.rope_scaling(i) for i in (0, 5)] == [None, {"rope_type": "linear", "factor": 8.0}]
    # the older config.json form the Hub's gemma-3-4b and larger carry reads alike
    older = {k: v for k, v in config.items() if k != "rope_parameters"} | {
        "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "rope_scaling": {"rope_type": "linear", "factor": 8.0}}
    assert read_spec(older) == spec
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_folder, dtype=torch.float32).eval()
    (ours,) = run_step(make_runner(folder), [(TOKENS, 0, [3, 1, 2, 0])])
    torch.testing.assert_close(ours, hf_logits(hf, TOKENS), atol=1e-4, rtol=0)
