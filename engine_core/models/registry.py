"""The model class of each family (families/catalog.py) nvllm runs."""

from torch import nn

from engine_core.families.spec import ModelSpec
from engine_core.models.decoder import DecoderForCausalLM

MODELS: dict[str, type[nn.Module]] = {
    "llama": DecoderForCausalLM,
    "qwen2": DecoderForCausalLM,
    "qwen3": DecoderForCausalLM,
    "gemma2": DecoderForCausalLM,
    "gemma3": DecoderForCausalLM,
    "qwen2_moe": DecoderForCausalLM,
    "qwen3_moe": DecoderForCausalLM,
    "mixtral": DecoderForCausalLM,
    "phi3": DecoderForCausalLM,
    "mistral": DecoderForCausalLM,
}


def model_class(spec: ModelSpec) -> type[nn.Module]:
    return MODELS[spec.family]
