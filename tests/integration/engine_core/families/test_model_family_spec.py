"""Model families as data (engine_core/families/): a config field transformers' code for the architecture reads is
read, known harmless, or refused by name, and one it never reads is ignored; what the spec reads (activation, MLP
biases) gives transformers' tokens; the one-call C decoder refuses by name what it does not implement, and the
modules then run."""

import json
import logging
import os

import pytest
import torch
import transformers

from common.config import EngineArgs
from common.random_models import RANDOM_MODELS
from tests.support.tiny_models import build_tiny_model
from engine_core.engine_config import resolve_engine_config
from engine_core.families.catalog import FAMILIES, family_for_gguf, read_spec
from engine_core.families.spec import UnsupportedConfig
from engine_core.cpu_kernels.decoder.loop_avx512_bf16 import IMPLEMENTED_F32, spec_issue
from engine_core.cpu_kernels.decoder.loop_portable import CpuDecoderF32
from engine_core.weights.model_folder import read_hf_config
from engine_core.worker.model_runner import ModelRunner
from tests.support.paged_kv_logits import TOKENS, hf_logits, run_step

pytestmark = pytest.mark.integration

CONFIG_CLASSES = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
                  "qwen3": transformers.Qwen3Config, "mistral": transformers.MistralConfig}
SMALL = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2)


def saved_config(tmp_path, family: str, **fields) -> dict:
    """config.json as transformers' own config class writes it, normalised as the engine reads it."""
    folder = tmp_path / family
    CONFIG_CLASSES[family](**SMALL, **fields).save_pretrained(folder)
    return read_hf_config(str(folder))


@pytest.mark.parametrize("family", sorted(CONFIG_CLASSES))
def test_every_family_reads_its_own_transformers_config(tmp_path, family):
    spec = read_spec(saved_config(tmp_path, family))
    assert spec.family == family and spec.num_layers == 2 and spec.activation == "silu"
    assert spec.qkv_bias is (family == "qwen2") and spec.qk_norm is (family == "qwen3")
    assert not spec.o_bias and not spec.mlp_bias


def test_the_default_model_reads(default_model_dir):
    spec = read_spec(read_hf_config(default_model_dir))
    assert (spec.family, spec.num_layers, spec.tie_word_embeddings) == ("llama", 30, True)


def test_biases_activation_and_rope_come_from_the_config(tmp_path):
    spec = read_spec(saved_config(tmp_path, "llama", attention_bias=True, mlp_bias=True, hidden_act="gelu_pytorch_tanh",
                                  rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}))
    assert (spec.qkv_bias, spec.o_bias, spec.mlp_bias, spec.activation) == (True, True, True, "gelu_tanh")
    assert spec.rope.scaling["rope_type"] == "llama3"


@pytest.mark.parametrize("family, fields, field", [
    ("llama", {"hidden_act": "relu2"}, "hidden_act"),
    ("llama", {"rope_scaling": {"rope_type": "dynamic", "factor": 4.0}}, "rope_scaling.rope_type"),
    ("qwen2", {"use_sliding_window": True, "sliding_window": 16, "layer_types": ["full_attention", "chunked_attention"]},
     "layer_types"),
    ("mistral", {"sliding_window": 0}, "sliding_window"),
])
def test_a_value_nvllm_does_not_implement_is_refused_by_name(tmp_path, family, fields, field):
    with pytest.raises(UnsupportedConfig) as refused:
        read_spec(saved_config(tmp_path, family, **fields))
    assert refused.value.field == field and repr(refused.value.field) in str(refused.value)


@pytest.mark.parametrize("field, value", [("attention_chunk_size", 8192), ("is_causal", False),
                                          ("sliding_window", 4096), ("partial_rotary_factor", 0.5),
                                          ("layer_types", ["sliding_attention", "full_attention"])])
def test_a_field_transformers_reads_and_nvllm_does_not_implement_is_refused_by_name(tmp_path, field, value):
    # transformers' shared mask, cache and rotary code reads these for a Llama too
    config = saved_config(tmp_path, "llama") | {field: value}
    with pytest.raises(UnsupportedConfig, match=field):
        read_spec(config)


@pytest.mark.parametrize("field, value", [("final_logit_softcapping", 30.0), ("num_local_experts", 8),
                                          ("query_pre_attn_scalar", 256), ("unk_token_id", 0),
                                          ("unsloth_version", "2025.3.8"), ("transformers.js_config", {"dtype": "q4"}),
                                          ("rope_interleaved", True), ("sliding_window", None)])
def test_a_field_transformers_never_reads_for_the_architecture_is_ignored(tmp_path, field, value, caplog):
    # Gemma's soft caps, Mixtral's experts, fine-tuners' bookkeeping: transformers' Llama runs the same without them
    plain = saved_config(tmp_path, "llama")
    with caplog.at_level(logging.DEBUG, logger="engine_core.families.family"):
        assert read_spec(plain | {field: value}) == read_spec(plain)
    assert field in caplog.text or value is None  # an inert value of a field transformers reads: no line


def test_sliding_window_fields_that_slide_nothing_are_accepted(tmp_path):
    # Qwen2.5 configs name a window with use_sliding_window false: every layer attends to all; DeepSeek's
    # Qwen2 distills say use_mrope, which transformers' Qwen2 never reads (Qwen2-VL's)
    config = saved_config(tmp_path, "qwen2", use_sliding_window=False, sliding_window=4096)
    spec = read_spec(config | {"use_mrope": False})
    assert spec.layer_windows == () and spec.window(0) is None and not spec.every_layer_slides
    assert read_spec(config | {"use_mrope": True}) == spec


@pytest.mark.parametrize("family, fields, windows", [
    # transformers' Qwen2/Qwen3: layers from max_window_layers on slide, only with use_sliding_window
    ("qwen2", dict(use_sliding_window=True, sliding_window=16, max_window_layers=1), (None, 16)),
    ("qwen3", dict(use_sliding_window=True, sliding_window=16, max_window_layers=0), (16, 16)),
    ("qwen2", dict(use_sliding_window=True, sliding_window=16, max_window_layers=2), ()),
    ("qwen2", dict(use_sliding_window=True, sliding_window=16, layer_types=["sliding_attention", "full_attention"]),
     (16, None)),
    ("qwen3", dict(use_sliding_window=False, sliding_window=16, layer_types=["sliding_attention"] * 2), ()),
    # Mistral: sliding_window for every layer, null for none
    ("mistral", dict(sliding_window=8), (8, 8)),
    ("mistral", dict(sliding_window=None), ()),
])
def test_sliding_windows_are_read_per_layer_as_transformers_reads_them(tmp_path, family, fields, windows):
    spec = read_spec(saved_config(tmp_path, family, **fields))
    assert spec.layer_windows == windows
    assert spec.every_layer_slides is (bool(windows) and None not in windows)


def test_a_mistral_config_with_layer_types_is_refused(tmp_path):
    # MistralForCausalLM slides every layer whatever layer_types says (Ministral's alternating layers are another class)
    with pytest.raises(UnsupportedConfig, match="layer_types"):
        read_spec(saved_config(tmp_path, "mistral", sliding_window=8) | {"layer_types": ["full_attention"] * 2})


def test_the_gguf_importer_names_come_from_the_families():
    # llama.cpp writes Mixtral as a llama with experts: the importer tells it apart by its expert count; a Mistral
    # file says llama too, and reads as the Llama family (weights/test_gguf_import.py: a window key makes it Mistral)
    imported = [f for f in FAMILIES if f.gguf_architecture is not None and f.name != "mistral"]
    assert [family_for_gguf(f.gguf_architecture, f.moe is not None) for f in imported] == imported
    assert family_for_gguf("llama").name == "llama" and family_for_gguf("llama", False).name == "llama"
    assert family_for_gguf("gemma3").name == "gemma3"


def test_an_unsupported_config_stops_the_engine_config_naming_the_field(tmp_path, default_model_dir):
    path = build_tiny_model(str(tmp_path / "m"), "llama", default_model_dir)
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    config["attention_chunk_size"] = 64
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    with pytest.raises(UnsupportedConfig, match="attention_chunk_size"):
        resolve_engine_config(EngineArgs(model=path, dtype="float32", device="cpu"))


# ---- what the spec reads runs as transformers runs it ----------------------------------------------------

VARIANTS = {"gelu_tanh": dict(hidden_act="gelu_pytorch_tanh"), "gelu": dict(hidden_act="gelu"),
            "mlp_bias": dict(mlp_bias=True, attention_bias=True)}


@pytest.fixture(scope="module")
def variant_models(tmp_path_factory, default_model_dir):
    root = tmp_path_factory.mktemp("variants")
    return {name: build_tiny_model(str(root / name), "llama", default_model_dir, **fields)
            for name, fields in VARIANTS.items()}


def test_spec_issue_names_the_values_the_c_loop_lacks(variant_models):
    specs = {name: read_spec(read_hf_config(path)) for name, path in variant_models.items()}
    assert "activation = 'gelu_tanh'" in spec_issue(specs["gelu_tanh"])  # the bf16 loops'
    assert spec_issue(specs["gelu_tanh"], IMPLEMENTED_F32) is None  # the float32 loop runs GELU's tanh form
    assert "activation = 'gelu'" in spec_issue(specs["gelu"], IMPLEMENTED_F32)
    assert "activation = 'gelu'" in spec_issue(specs["gelu"])
    assert spec_issue(specs["mlp_bias"]).startswith("o_bias = True")


@pytest.mark.parametrize("variant", ["gelu", "mlp_bias"])
def test_the_c_loop_refuses_by_name_and_the_modules_match_transformers(variant_models, tiny_models, variant, caplog):
    """float32 on the CPU: the one-call C loop runs a plain Llama, refuses these by name (in the load log), and
    the modules' logits equal transformers'."""
    def runner(path):
        r = ModelRunner(resolve_engine_config(EngineArgs(model=path, dtype="float32", device="cpu", block_size=4,
                                                         kv_cache_memory="4MiB")))
        r.allocate_kv_cache(16)
        return r

    assert CpuDecoderF32.why_not(runner(tiny_models["llama"]).model) is None  # the loop runs where it can
    with caplog.at_level(logging.INFO, logger="nvllm"):
        ours = runner(variant_models[variant])
    assert ours.model.cpu_decoder is None
    field = "activation" if variant.startswith("gelu") else "o_bias"
    assert field in CpuDecoderF32.why_not(ours.model)
    assert any("run as modules" in r.message and field in r.message for r in caplog.records)
    hf = transformers.AutoModelForCausalLM.from_pretrained(variant_models[variant], dtype=torch.float32).eval()
    (logits,) = run_step(ours, [(TOKENS[:13], 0, [3, 1, 2, 0])])
    torch.testing.assert_close(logits, hf_logits(hf, TOKENS[:13]), atol=1e-4, rtol=0)


@pytest.mark.parametrize("variant", ["gelu_tanh", "mlp_bias"])
def test_greedy_tokens_equal_transformers_generate(variant_models, variant):
    from frontend import LLM, SamplingParams

    path = variant_models[variant]
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompts = [[5, 900, 17, 4000, 31], [77, 12, 3000, 8, 8, 410, 2500]]
    with LLM(path, dtype="float32", block_size=4, kv_cache_memory="4MiB", max_model_len=64) as llm:
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True), use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False, min_new_tokens=20)
        assert out.outputs[0].token_ids == ref[0, len(prompt):].tolist()


def test_an_unsupported_architecture_is_an_error_where_the_user_called(tmp_path):
    """LLM(...) raises the core's own reason (it names the architecture and the ones nvllm runs), not "see the
    log"; a ValueError, since the caller's model is at fault."""
    from frontend import LLM

    folder = tmp_path / "gpt2"
    transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=128,
                            architectures=["GPT2LMHeadModel"]).save_pretrained(folder)
    supported = ", ".join(f.architecture for f in FAMILIES)
    with pytest.raises(ValueError, match=f"architecture GPT2LMHeadModel is not supported; nvllm runs {supported}$"):
        LLM(str(folder))


@pytest.mark.parametrize("name", sorted(RANDOM_MODELS))
def test_every_random_model_shape_reads_as_its_family(tmp_path, name):
    """`nvllm bench throughput --random-model NAME` builds a model nvllm runs, of the family it is named for."""
    fields = dict(RANDOM_MODELS[name])
    config_class, architecture = getattr(transformers, fields.pop("config")), fields.pop("model")
    config_class(**fields, architectures=[architecture]).save_pretrained(tmp_path)
    spec = read_spec(read_hf_config(str(tmp_path)))
    assert spec.architecture == architecture and spec.hidden_size == fields["hidden_size"]
