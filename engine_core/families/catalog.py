"""The families nvllm runs, by config.json architecture and by GGUF architecture."""

from engine_core.families import moe_fields
from engine_core.families.family import SLIDING_FIELDS, Family
from engine_core.families.gemma import GEMMA2_READS, GEMMA3_READS, GEMMA3_VISION, gemma2_values, gemma3_values
from engine_core.families.spec import ModelSpec

LLAMA = Family(
    name="llama", architecture="LlamaForCausalLM", model_type="llama", gguf_architecture="llama",
    gguf_qk_permuted=True, reads=frozenset({"attention_bias", "mlp_bias"}),
    ignores={"pretraining_tp": "transformers' Llama computes the same product unsliced"})

QWEN2 = Family(
    name="qwen2", architecture="Qwen2ForCausalLM", model_type="qwen2", gguf_architecture="qwen2",
    gguf_qk_permuted=False, qkv_bias=True, reads=SLIDING_FIELDS, windows="qwen")

QWEN3 = Family(
    name="qwen3", architecture="Qwen3ForCausalLM", model_type="qwen3", gguf_architecture="qwen3",
    gguf_qk_permuted=False, qk_norm=True, reads=frozenset({"attention_bias"}) | SLIDING_FIELDS,
    windows="qwen")

GEMMA2 = Family(
    name="gemma2", architecture="Gemma2ForCausalLM", model_type="gemma2", gguf_architecture="gemma2",
    gguf_qk_permuted=False, qkv_bias=False, reads=GEMMA2_READS, own_values=gemma2_values)

GEMMA3 = Family(
    name="gemma3", architecture="Gemma3ForCausalLM", model_type="gemma3_text", gguf_architecture="gemma3",
    gguf_qk_permuted=False, qkv_bias=False, qk_norm=True, reads=GEMMA3_READS, own_values=gemma3_values,
    ignores=GEMMA3_VISION)

QWEN2_MOE = Family(
    name="qwen2_moe", architecture="Qwen2MoeForCausalLM", model_type="qwen2_moe", gguf_architecture="qwen2moe",
    gguf_qk_permuted=False, qkv_bias=True, moe="qwen", ignores=moe_fields.ROUTER_TRAINING,
    reads=SLIDING_FIELDS | moe_fields.QWEN_MOE_FIELDS | moe_fields.SHARED_EXPERT_FIELDS | {"qkv_bias"},
    windows="qwen2_moe")

QWEN3_MOE = Family(
    name="qwen3_moe", architecture="Qwen3MoeForCausalLM", model_type="qwen3_moe", gguf_architecture="qwen3moe",
    gguf_qk_permuted=False, qk_norm=True, moe="qwen", ignores=moe_fields.ROUTER_TRAINING,
    reads=SLIDING_FIELDS | moe_fields.QWEN_MOE_FIELDS | {"attention_bias"}, windows="qwen3_moe")

# llama.cpp writes Mixtral as "llama" (experts in blk.N.ffn_*_exps): the GGUF importer tells them apart
MIXTRAL = Family(
    name="mixtral", architecture="MixtralForCausalLM", model_type="mixtral", gguf_architecture="llama",
    gguf_qk_permuted=True, moe="mixtral", ignores=moe_fields.MIXTRAL_TRAINING, reads=moe_fields.MIXTRAL_FIELDS,
    # sliding_window (null: none) holds for every layer, as Mistral's
    windows="every_layer")

# llama.cpp converts Mistral checkpoints to its llama architecture (q/k rows permuted as Llama's), so a GGUF file
# reads as LLAMA; its layer_types would ask for Ministral's alternating layers, which MistralForCausalLM ignores
MISTRAL = Family(
    name="mistral", architecture="MistralForCausalLM", model_type="mistral", gguf_architecture="llama",
    gguf_qk_permuted=True, qkv_bias=False, reads=frozenset({"sliding_window"}), windows="every_layer")

# Phi-3 and Phi-4-mini (partial_rotary_factor 0.75, tied embeddings): q/k/v and gate/up stored fused, LongRoPE
PHI3 = Family(
    name="phi3", architecture="Phi3ForCausalLM", model_type="phi3", gguf_architecture="phi3",
    gguf_qk_permuted=False, qkv_bias=False,
    reads=frozenset({"partial_rotary_factor", "original_max_position_embeddings", "sliding_window"}),
    ignores={"resid_pdrop": "dropout: training only", "embd_pdrop": "dropout: training only"},
    rope_aliases={"su": "longrope", "yarn": "longrope"},  # transformers' Phi3Config renames both
    windows="every_layer")  # sliding_window for every layer, as transformers' Phi3 (no use_sliding_window switch)

FAMILIES = (LLAMA, QWEN2, QWEN3, GEMMA2, GEMMA3, PHI3, QWEN2_MOE, QWEN3_MOE, MIXTRAL, MISTRAL)


class UnsupportedArchitecture(ValueError):
    """A model whose architecture no family in FAMILIES runs."""


def family_for(architectures: list[str] | None, model_type: str | None = None) -> Family:
    """By config.json's architectures, else (a config without them, as transformers' Auto classes do) its model_type."""
    for arch in architectures or []:
        for family in FAMILIES:
            # "Qwen3Model": the decoder without its LM head, as transformers' AutoModel saves an embedding model
            if arch in (family.architecture, family.architecture.removesuffix("ForCausalLM") + "Model"):
                return family
    if not architectures:
        for family in FAMILIES:
            if family.model_type == model_type:
                return family
    named = (f"architecture {' / '.join(architectures)}" if architectures
             else f"model_type {model_type!r} (config.json names no architectures)")
    raise UnsupportedArchitecture(f"{named} is not supported; nvllm runs "
                                  f"{', '.join(f.architecture for f in FAMILIES)}")


def family_for_gguf(name: str, has_experts: bool | None = None) -> Family | None:
    """The family of a GGUF general.architecture; `has_experts` (the file's expert_count) tells a llama.cpp "llama"
    with experts (Mixtral) from a dense one; None: the first family of that name."""
    named = [f for f in FAMILIES if name is not None and f.gguf_architecture == name]
    if has_experts is not None:
        named = [f for f in named if (f.moe is not None) == has_experts] or named
    return named[0] if named else None


def read_spec(config: dict) -> ModelSpec:
    """The ModelSpec of a normalised config.json; spec.UnsupportedConfig for a field or value nvllm cannot honour."""
    return family_for(config.get("architectures"), config.get("model_type")).read(config)
