"""The families nvllm runs, by config.json architecture and by GGUF architecture."""

from engine_core.families.family import SLIDING_FIELDS, Family
from engine_core.families.gemma import GEMMA3_READS, gemma3_values
from engine_core.families.spec import ModelSpec

LLAMA = Family(
    name="llama", architecture="LlamaForCausalLM", model_type="llama", gguf_architecture="llama",
    gguf_qk_permuted=True, reads=frozenset({"attention_bias", "mlp_bias", "rope_interleaved"}),
    ignores={"pretraining_tp": "transformers' Llama computes the same product unsliced",
             "is_llama_config": "a marker nanotron-made configs (SmolLM2's) carry"})

QWEN2 = Family(
    name="qwen2", architecture="Qwen2ForCausalLM", model_type="qwen2", gguf_architecture="qwen2",
    gguf_qk_permuted=False, qkv_bias=True, reads=SLIDING_FIELDS | {"use_mrope"})  # false in text-only configs

QWEN3 = Family(
    name="qwen3", architecture="Qwen3ForCausalLM", model_type="qwen3", gguf_architecture="qwen3",
    gguf_qk_permuted=False, qk_norm=True, reads=frozenset({"attention_bias"}) | SLIDING_FIELDS)

GEMMA3 = Family(
    name="gemma3", architecture="Gemma3ForCausalLM", model_type="gemma3_text", gguf_architecture=None,
    gguf_qk_permuted=False, qkv_bias=False, qk_norm=True, reads=GEMMA3_READS, own_values=gemma3_values)

FAMILIES = (LLAMA, QWEN2, QWEN3, GEMMA3)


class UnsupportedArchitecture(ValueError):
    """A model whose architecture no family in FAMILIES runs."""


def family_for(architectures: list[str] | None, model_type: str | None = None) -> Family:
    """By config.json's architectures, else (a config without them, as transformers' Auto classes do) its model_type."""
    for arch in architectures or []:
        for family in FAMILIES:
            if family.architecture == arch:
                return family
    if not architectures:
        for family in FAMILIES:
            if family.model_type == model_type:
                return family
    named = (f"architecture {' / '.join(architectures)}" if architectures
             else f"model_type {model_type!r} (config.json names no architectures)")
    raise UnsupportedArchitecture(f"{named} is not supported; nvllm runs "
                                  f"{', '.join(f.architecture for f in FAMILIES)}")


def family_for_gguf(name: str) -> Family | None:
    return next((f for f in FAMILIES if name is not None and f.gguf_architecture == name), None)


def read_spec(config: dict) -> ModelSpec:
    """The ModelSpec of a normalised config.json; spec.UnsupportedConfig for a field or value nvllm cannot honour."""
    return family_for(config.get("architectures"), config.get("model_type")).read(config)
