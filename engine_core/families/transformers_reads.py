"""The config.json fields transformers' own code reads for each family's architecture: derived from its source
by tests/support/transformers_reads.py (the configuration class's fields and the legacy names it converts, the modeling
module's `config.X` reads, and those of the shared rotary, mask and cache code), never written by hand.

A field outside a family's set changes nothing transformers computes for that architecture, so nvllm ignores it
(family.py); a field inside it is honoured, or refused by name. tests/unit/engine_core/families/test_config_reads.py
re-derives the sets
from the installed transformers and fails when it reads a field these do not list.
"""

TRANSFORMERS_VERSION = "5.24.0"

READS = {
    "llama": frozenset({  # llama
        "architectures", "attention_bias", "attention_chunk_size", "attention_dropout", "bos_token_id",
        "chunk_size_feed_forward", "dtype", "eos_token_id", "head_dim", "hidden_act", "hidden_size", "id2label",
        "initializer_range", "intermediate_size", "is_causal", "is_encoder_decoder", "kv_sharing_modes", "label2id",
        "layer_types", "max_position_embeddings", "mlp_bias", "num_attention_heads", "num_hidden_layers",
        "num_key_value_heads", "number_of_conv_states", "output_hidden_states", "pad_token_id",
        "partial_rotary_factor", "per_layer_config", "pretraining_tp", "problem_type", "return_dict",
        "rms_norm_eps", "rope_parameters", "rope_scaling", "rope_theta", "sliding_window", "tie_word_embeddings",
        "transformers_version", "use_cache", "vocab_size",
    }),
    "qwen2": frozenset({  # qwen2
        "architectures", "attention_chunk_size", "attention_dropout", "bos_token_id", "chunk_size_feed_forward",
        "dtype", "eos_token_id", "head_dim", "hidden_act", "hidden_size", "id2label", "initializer_range",
        "intermediate_size", "is_causal", "is_encoder_decoder", "kv_sharing_modes", "label2id", "layer_types",
        "max_position_embeddings", "max_window_layers", "num_attention_heads", "num_hidden_layers",
        "num_key_value_heads", "number_of_conv_states", "output_hidden_states", "pad_token_id",
        "partial_rotary_factor", "per_layer_config", "problem_type", "return_dict", "rms_norm_eps",
        "rope_parameters", "rope_scaling", "rope_theta", "sliding_window", "tie_word_embeddings",
        "transformers_version", "use_cache", "use_sliding_window", "vocab_size",
    }),
    "qwen3": frozenset({  # qwen3
        "architectures", "attention_bias", "attention_chunk_size", "attention_dropout", "bos_token_id",
        "chunk_size_feed_forward", "dtype", "eos_token_id", "head_dim", "hidden_act", "hidden_size", "id2label",
        "initializer_range", "intermediate_size", "is_causal", "is_encoder_decoder", "kv_sharing_modes", "label2id",
        "layer_types", "max_position_embeddings", "max_window_layers", "num_attention_heads", "num_hidden_layers",
        "num_key_value_heads", "number_of_conv_states", "output_hidden_states", "pad_token_id",
        "partial_rotary_factor", "per_layer_config", "problem_type", "return_dict", "rms_norm_eps",
        "rope_parameters", "rope_scaling", "rope_theta", "sliding_window", "tie_word_embeddings",
        "transformers_version", "use_cache", "use_sliding_window", "vocab_size",
    }),
    "gemma2": frozenset({  # gemma2
        "architectures", "attention_bias", "attention_chunk_size", "attention_dropout", "attn_logit_softcapping",
        "bos_token_id", "chunk_size_feed_forward", "dtype", "eos_token_id", "final_logit_softcapping", "head_dim",
        "hidden_activation", "hidden_size", "id2label", "initializer_range", "intermediate_size", "is_causal",
        "is_encoder_decoder", "kv_sharing_modes", "label2id", "layer_types", "max_position_embeddings",
        "num_attention_heads", "num_hidden_layers", "num_key_value_heads", "number_of_conv_states",
        "output_hidden_states", "pad_token_id", "partial_rotary_factor", "per_layer_config", "problem_type",
        "query_pre_attn_scalar", "return_dict", "rms_norm_eps", "rope_parameters", "rope_scaling", "rope_theta",
        "sliding_window", "tie_word_embeddings", "transformers_version", "use_bidirectional_attention", "use_cache",
        "vocab_size",
    }),
    "gemma3": frozenset({  # gemma3_text
        "architectures", "attention_bias", "attention_chunk_size", "attention_dropout", "attn_logit_softcapping",
        "bos_token_id", "chunk_size_feed_forward", "dtype", "eos_token_id", "final_logit_softcapping", "head_dim",
        "hidden_activation", "hidden_size", "id2label", "image_size", "image_token_id", "initializer_range",
        "intermediate_size", "is_causal", "is_encoder_decoder", "kv_sharing_modes", "label2id", "layer_norm_eps",
        "layer_types", "max_position_embeddings", "mm_tokens_per_image", "num_attention_heads", "num_hidden_layers",
        "num_key_value_heads", "number_of_conv_states", "output_hidden_states", "pad_token_id",
        "partial_rotary_factor", "patch_size", "per_layer_config", "problem_type", "query_pre_attn_scalar",
        "return_dict", "rms_norm_eps", "rope_local_base_freq", "rope_parameters", "rope_scaling", "rope_theta",
        "sliding_window", "sliding_window_pattern", "text_config", "tie_word_embeddings", "transformers_version",
        "use_bidirectional_attention", "use_cache", "vision_config", "vocab_size",
    }),
    "phi3": frozenset({  # phi3
        "architectures", "attention_chunk_size", "attention_dropout", "bos_token_id", "chunk_size_feed_forward",
        "dtype", "embd_pdrop", "eos_token_id", "head_dim", "hidden_act", "hidden_size", "id2label",
        "initializer_range", "intermediate_size", "is_causal", "is_encoder_decoder", "kv_sharing_modes", "label2id",
        "layer_types", "max_position_embeddings", "num_attention_heads", "num_hidden_layers", "num_key_value_heads",
        "number_of_conv_states", "original_max_position_embeddings", "output_hidden_states", "pad_token_id",
        "partial_rotary_factor", "per_layer_config", "problem_type", "resid_pdrop", "return_dict", "rms_norm_eps",
        "rope_parameters", "rope_scaling", "rope_theta", "sliding_window", "tie_word_embeddings",
        "transformers_version", "use_cache", "vocab_size",
    }),
    "qwen2_moe": frozenset({  # qwen2_moe
        "architectures", "attention_chunk_size", "attention_dropout", "bos_token_id", "chunk_size_feed_forward",
        "decoder_sparse_step", "dtype", "eos_token_id", "head_dim", "hidden_act", "hidden_size", "id2label",
        "initializer_range", "intermediate_size", "is_causal", "is_encoder_decoder", "kv_sharing_modes", "label2id",
        "layer_types", "max_position_embeddings", "max_window_layers", "mlp_only_layers", "moe_intermediate_size",
        "norm_topk_prob", "num_attention_heads", "num_experts", "num_experts_per_tok", "num_hidden_layers",
        "num_key_value_heads", "number_of_conv_states", "output_hidden_states", "output_router_logits",
        "pad_token_id", "partial_rotary_factor", "per_layer_config", "problem_type", "qkv_bias", "return_dict",
        "rms_norm_eps", "rope_parameters", "rope_scaling", "rope_theta", "router_aux_loss_coef",
        "shared_expert_intermediate_size", "sliding_window", "tie_word_embeddings", "transformers_version",
        "use_cache", "use_sliding_window", "vocab_size",
    }),
    "qwen3_moe": frozenset({  # qwen3_moe
        "architectures", "attention_bias", "attention_chunk_size", "attention_dropout", "bos_token_id",
        "chunk_size_feed_forward", "decoder_sparse_step", "dtype", "eos_token_id", "head_dim", "hidden_act",
        "hidden_size", "id2label", "initializer_range", "intermediate_size", "is_causal", "is_encoder_decoder",
        "kv_sharing_modes", "label2id", "layer_types", "max_position_embeddings", "mlp_only_layers",
        "moe_intermediate_size", "norm_topk_prob", "num_attention_heads", "num_experts", "num_experts_per_tok",
        "num_hidden_layers", "num_key_value_heads", "num_local_experts", "number_of_conv_states",
        "output_hidden_states", "output_router_logits", "pad_token_id", "partial_rotary_factor", "per_layer_config",
        "problem_type", "return_dict", "rms_norm_eps", "rope_parameters", "rope_scaling", "rope_theta",
        "router_aux_loss_coef", "sliding_window", "tie_word_embeddings", "transformers_version", "use_cache",
        "use_sliding_window", "vocab_size",
    }),
    "mixtral": frozenset({  # mixtral
        "architectures", "attention_chunk_size", "attention_dropout", "bos_token_id", "chunk_size_feed_forward",
        "dtype", "eos_token_id", "head_dim", "hidden_act", "hidden_size", "id2label", "initializer_range",
        "intermediate_size", "is_causal", "is_encoder_decoder", "kv_sharing_modes", "label2id", "layer_types",
        "max_position_embeddings", "num_attention_heads", "num_experts", "num_experts_per_tok", "num_hidden_layers",
        "num_key_value_heads", "num_local_experts", "number_of_conv_states", "output_hidden_states",
        "output_router_logits", "pad_token_id", "partial_rotary_factor", "per_layer_config", "problem_type",
        "return_dict", "rms_norm_eps", "rope_parameters", "rope_scaling", "rope_theta", "router_aux_loss_coef",
        "router_jitter_noise", "sliding_window", "tie_word_embeddings", "transformers_version", "use_cache",
        "vocab_size",
    }),
    "mistral": frozenset({  # mistral
        "architectures", "attention_chunk_size", "attention_dropout", "bos_token_id", "chunk_size_feed_forward",
        "dtype", "eos_token_id", "head_dim", "hidden_act", "hidden_size", "id2label", "initializer_range",
        "intermediate_size", "is_causal", "is_encoder_decoder", "kv_sharing_modes", "label2id", "layer_types",
        "max_position_embeddings", "num_attention_heads", "num_hidden_layers", "num_key_value_heads",
        "number_of_conv_states", "output_hidden_states", "pad_token_id", "partial_rotary_factor",
        "per_layer_config", "problem_type", "return_dict", "rms_norm_eps", "rope_parameters", "rope_scaling",
        "rope_theta", "sliding_window", "tie_word_embeddings", "transformers_version", "use_cache", "vocab_size",
    }),
}
