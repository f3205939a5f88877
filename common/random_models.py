"""The model shapes `nvllm bench throughput --random-model NAME` builds with random weights: one per family (its
transformers config fields). Where a family has a released model of about 1B parameters or fewer, the shape is that
model's; the others (Mistral, Phi-3, the mixtures of experts, whose released models are 4-47B) keep the family's
layout at 1-3B parameters, named for the family and size, so a CPU can run them. Data only, so the command line
(frontend) can list the names without the engine core's code."""

RANDOM_MODELS: dict[str, dict] = {
    # Llama 3.2 1B
    "llama-3.2-1b": dict(config="LlamaConfig", model="LlamaForCausalLM", hidden_size=2048, num_hidden_layers=16,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=64, intermediate_size=8192,
                         vocab_size=128256, tie_word_embeddings=True, max_position_embeddings=131072,
                         rope_theta=500000.0, rms_norm_eps=1e-5),
    # Qwen2.5 0.5B
    "qwen2.5-0.5b": dict(config="Qwen2Config", model="Qwen2ForCausalLM", hidden_size=896, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864, vocab_size=151936,
                         tie_word_embeddings=True, max_position_embeddings=32768, rope_theta=1000000.0,
                         rms_norm_eps=1e-6),
    # Qwen3 0.6B (nano-vllm's GPU workload)
    "qwen3-0.6b": dict(config="Qwen3Config", model="Qwen3ForCausalLM", hidden_size=1024, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, intermediate_size=3072,
                       vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=40960,
                       rope_theta=1000000.0, rms_norm_eps=1e-6),
    # Gemma 3 1B: five sliding-window layers (512 tokens) to each global one
    "gemma-3-1b": dict(config="Gemma3TextConfig", model="Gemma3ForCausalLM", hidden_size=1152, num_hidden_layers=26,
                       num_attention_heads=4, num_key_value_heads=1, head_dim=256, intermediate_size=6912,
                       vocab_size=262144, tie_word_embeddings=True, max_position_embeddings=32768,
                       query_pre_attn_scalar=256, sliding_window=512, rms_norm_eps=1e-6),
    # Gemma 2 2B: sliding-window (4096 tokens) and global layers alternating, scores capped at 50, logits at 30
    "gemma-2-2b": dict(config="Gemma2Config", model="Gemma2ForCausalLM", hidden_size=2304, num_hidden_layers=26,
                       num_attention_heads=8, num_key_value_heads=4, head_dim=256, intermediate_size=9216,
                       vocab_size=256000, tie_word_embeddings=True, max_position_embeddings=8192,
                       query_pre_attn_scalar=256, sliding_window=4096, attn_logit_softcapping=50.0,
                       final_logit_softcapping=30.0, rms_norm_eps=1e-6),
    # Mistral v0.1's layout (every layer slides, 4096 tokens) at 0.9B
    "mistral-1b": dict(config="MistralConfig", model="MistralForCausalLM", hidden_size=2048, num_hidden_layers=16,
                       num_attention_heads=32, num_key_value_heads=8, head_dim=64, intermediate_size=6144,
                       vocab_size=32768, tie_word_embeddings=False, max_position_embeddings=32768, sliding_window=4096,
                       rope_theta=10000.0, rms_norm_eps=1e-5),
    # Phi-4-mini's layout (partial rotary 0.75, tied, its 200k vocabulary) at 1.2B
    "phi3-1b": dict(config="Phi3Config", model="Phi3ForCausalLM", hidden_size=2048, num_hidden_layers=16,
                    num_attention_heads=32, num_key_value_heads=8, intermediate_size=6144, vocab_size=200064,
                    tie_word_embeddings=True, max_position_embeddings=4096, partial_rotary_factor=0.75,
                    rope_theta=10000.0, rms_norm_eps=1e-5, pad_token_id=0),
    # Qwen1.5-MoE-A2.7B's layout (60 experts, top 4, a gated shared expert) at 1.2B
    "qwen2-moe-1b": dict(config="Qwen2MoeConfig", model="Qwen2MoeForCausalLM", hidden_size=1024, num_hidden_layers=16,
                         num_attention_heads=16, num_key_value_heads=4, intermediate_size=2816, num_experts=60,
                         num_experts_per_tok=4, moe_intermediate_size=256, shared_expert_intermediate_size=1024,
                         vocab_size=151936, tie_word_embeddings=False, max_position_embeddings=32768,
                         rope_theta=1000000.0, rms_norm_eps=1e-6),
    # Qwen3-30B-A3B's layout (128 experts, top 8, renormalised) at 2.8B
    "qwen3-moe-3b": dict(config="Qwen3MoeConfig", model="Qwen3MoeForCausalLM", hidden_size=1024, num_hidden_layers=16,
                         num_attention_heads=16, num_key_value_heads=4, head_dim=128, intermediate_size=3072,
                         num_experts=128, num_experts_per_tok=8, moe_intermediate_size=384, norm_topk_prob=True,
                         vocab_size=151936, tie_word_embeddings=False, max_position_embeddings=32768,
                         rope_theta=1000000.0, rms_norm_eps=1e-6),
    # Mixtral's layout (8 experts, top 2) at 1.3B
    "mixtral-1b": dict(config="MixtralConfig", model="MixtralForCausalLM", hidden_size=1024, num_hidden_layers=16,
                       num_attention_heads=16, num_key_value_heads=4, head_dim=64, intermediate_size=3072,
                       num_local_experts=8, num_experts_per_tok=2, vocab_size=32000, tie_word_embeddings=False,
                       max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-5),
}
