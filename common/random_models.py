"""The model shapes `nvllm bench throughput --random-model NAME` builds with random weights: one per family, each
the shape of a real small model of that family (its transformers config fields). Data only, so the command line
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
}
