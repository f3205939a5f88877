"""Model classes by the `architectures` name in config.json."""

from torch import nn

from engine_core.models.llama import LlamaForCausalLM
from engine_core.models.qwen2 import Qwen2ForCausalLM
from engine_core.models.qwen3 import Qwen3ForCausalLM

MODELS: dict[str, type[nn.Module]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
}


def model_class(architectures: list[str]) -> type[nn.Module]:
    for arch in architectures or []:
        if arch in MODELS:
            return MODELS[arch]
    raise ValueError(f"architectures {architectures} not supported; nvllm runs {', '.join(MODELS)}")
