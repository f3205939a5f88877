from engine_core.models.llama import LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    qk_norm = True
    # Qwen3 checkpoints may carry attention_bias; it is read from the config
