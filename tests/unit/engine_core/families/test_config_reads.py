"""Real checkpoints load: the config fields that matter are the ones transformers' own code for the architecture
reads (derived from the installed transformers, kept in each family record), and published config.json files of
every family are accepted with the spec they describe, or refused naming why (quantized ones by method, but FP8
weight blocks, which are dequantized at load)."""

import json
import os
import shutil

import pytest
import transformers

from engine_core.families import config_fields
from engine_core.families.catalog import FAMILIES, read_spec
from engine_core.families.spec import UnsupportedConfig
from engine_core.families.transformers_reads import READS
from engine_core.weights.model_folder import read_hf_config
from tests.support.paths import DATA
from tests.support.transformers_reads import derive

pytestmark = pytest.mark.unit

REAL_CONFIGS = os.path.join(DATA, "real_configs")


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_the_recorded_reads_cover_what_the_installed_transformers_reads(family):
    """Fails when a transformers release reads a field the record lacks (nvllm would ignore it, and transformers
    would not): regenerate engine_core/families/transformers_reads.py with `python tests/support/transformers_reads.py`
    and decide each new field in the family record."""
    assert family.transformers_reads == READS[family.name]
    # a new bookkeeping field (never changing the outputs) may go unrecorded: nvllm would ignore it either way
    harmless = config_fields.NEVER_CHANGE_OUTPUTS | set(family.ignores)
    new = derive(family.model_type) - family.transformers_reads - harmless
    assert not new, f"transformers {transformers.__version__} reads {sorted(new)} for {family.name}"


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_every_field_transformers_reads_is_decided(family):
    """Read into the spec, known never to change the outputs, or held to the one value every family runs."""
    undecided = {name for name in family.transformers_reads
                 if not family.handles(name) and name not in config_fields.SHARED_FIXED}
    assert not undecided


def _read(tmp_path, name: str):
    folder = tmp_path / name.removesuffix(".json")
    folder.mkdir()
    shutil.copy(os.path.join(REAL_CONFIGS, name), folder / "config.json")
    return read_spec(read_hf_config(str(folder)))


# file -> the spec values it must give (family first)
ACCEPTED = {
    "llama-2-7b-hf.json": dict(family="llama", num_layers=32, num_kv_heads=32, tie_word_embeddings=False),
    "llama-3.1-8b.json": dict(family="llama", num_kv_heads=8, rope_type="llama3"),
    "llama-3.2-1b-instruct.json": dict(family="llama", rope_type="llama3", tie_word_embeddings=True),
    "tinyllama-1.1b-chat-v1.0.json": dict(family="llama", num_layers=22, num_kv_heads=4),
    "smollm-1.7b-instruct.json": dict(family="llama", num_layers=24),
    # transformers.js_config, is_llama_config, rope_interleaved: fields transformers' Llama never reads
    "smollm2-135m-instruct.json": dict(family="llama", num_layers=30, num_kv_heads=3, tie_word_embeddings=True),
    "smollm2-135m-finetune-transformers-v5.json": dict(family="llama", num_layers=30),
    "qwen1.5-1.8b-chat.json": dict(family="qwen2", qkv_bias=True, layer_windows=()),
    # use_sliding_window false: no layer slides, whatever sliding_window and max_window_layers say
    "qwen2.5-3b-instruct.json": dict(family="qwen2", qkv_bias=True, layer_windows=(), tie_word_embeddings=True),
    "qwen2.5-0.5b-instruct-onnx-community.json": dict(family="qwen2", num_layers=24, layer_windows=()),
    "qwen2.5-0.5b-finetune-transformers-v5.json": dict(family="qwen2", layer_windows=()),
    "sakura-14b-qwen2.5-v1.0.json": dict(family="qwen2", num_layers=48),
    "cogito-v1-preview-qwen-14b.json": dict(family="qwen2", vocab_size=151665),
    "qwen3-0.6b.json": dict(family="qwen3", qk_norm=True, head_dim=128, tie_word_embeddings=True),
    "qwen3-8b.json": dict(family="qwen3", num_layers=36),
    # unsloth_version, unsloth_fixed: the fine-tuner's bookkeeping
    "qwen3-0.6b-unsloth-finetune-vnchat.json": dict(family="qwen3", num_layers=28),
    "qwen3-30b-a3b.json": dict(family="qwen3_moe", num_experts=128, experts_per_token=8, renormalize_topk=True),
    "qwen1.5-moe-a2.7b.json": dict(family="qwen2_moe", num_experts=60, shared_expert_intermediate_size=5632),
    "gemma-2-2b-it.json": dict(family="gemma2", final_logit_softcap=30.0, attn_logit_softcap=50.0),
    "gemma-2-2b-it-poem-finetune.json": dict(family="gemma2", num_layers=26),
    # an early Gemma 2 release: sliding_window_size, a copy of sliding_window that transformers' Gemma 2 never reads
    "gemma-2-9b-early-sliding-window-size.json": dict(family="gemma2", first_windows=(4096, None)),
    "gemma-3-1b-it.json": dict(family="gemma3", qk_norm=True, first_windows=(512, 512)),
    "phi-3.5-mini-instruct.json": dict(family="phi3", rope_type="longrope"),
    # Phi-4-mini: 0.75 of each head rotates; full_attn_mod and the bias switches are its own code's
    "phi-4-mini-instruct.json": dict(family="phi3", rope_type="longrope", rotary_dim=96, qkv_bias=False),
    "phi-4.json": dict(family="phi3", num_layers=40),
    "prymmal-phi3-3b-slerp.json": dict(family="phi3", first_windows=(2047, 2047)),
    "phi-3-mini-4k-finetune-dtype.json": dict(family="phi3", first_windows=(2047, 2047)),
    "mistral-7b-v0.3.json": dict(family="mistral", layer_windows=(), vocab_size=32768),
    "dolphin3.0-r1-mistral-24b.json": dict(family="mistral", vocab_size=131074),
    "mixtral-8x7b-v0.1.json": dict(family="mixtral", num_experts=8, experts_per_token=2),
    "dolphin-2.5-mixtral-8x7b.json": dict(family="mixtral", vocab_size=32002),
    # FP8 weight blocks: dequantized at load (tests/integration/engine_core/weights/test_fp8_checkpoint.py)
    "qwen3-32b-fp8.json": dict(family="qwen3", num_layers=64),
    "qwen3-30b-a3b-fp8.json": dict(family="qwen3_moe", num_experts=128),
}
# file -> the method its quantization_config names
QUANTIZED = {
    "llama-2-13b-chat-gptq.json": "gptq",
    "genz-70b-gptq-3bit.json": "gptq", "llama-2-13b-computer-engineering-bnb4bit.json": "bitsandbytes",
    "llama-3.1-8b-computer-networks-bnb8bit.json": "bitsandbytes",
}


def test_the_set_is_every_file_committed():
    assert set(ACCEPTED) | set(QUANTIZED) == {n for n in os.listdir(REAL_CONFIGS) if n.endswith(".json")}


def _value(spec, name: str):
    if name == "rope_type":
        return (spec.rope.scaling or {}).get("rope_type")
    if name == "rotary_dim":
        return spec.rope.rotary_dim
    if name == "first_windows":
        return spec.layer_windows[:2]
    return getattr(spec, name)


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_a_published_config_is_accepted_with_its_spec(tmp_path, name):
    spec = _read(tmp_path, name)
    for field, expected in ACCEPTED[name].items():
        assert _value(spec, field) == expected, field


@pytest.mark.parametrize("name", sorted(QUANTIZED))
def test_a_quantized_checkpoint_is_refused_naming_its_method(tmp_path, name):
    with pytest.raises(UnsupportedConfig) as refused:
        _read(tmp_path, name)
    message = str(refused.value)
    assert refused.value.field == "quantization_config" and repr(QUANTIZED[name]) in message
    assert "GGUF" in message and "not a field nvllm knows" not in message


@pytest.mark.parametrize("method", ["awq", "compressed-tensors", "torchao"])
def test_other_methods_are_named_too(tmp_path, method):
    with open(os.path.join(REAL_CONFIGS, "qwen3-8b.json")) as f:
        config = json.load(f) | {"quantization_config": {"quant_method": method, "bits": 4}}
    with pytest.raises(UnsupportedConfig, match=f"'quantization_config' = '{method}'"):
        read_spec(config)
