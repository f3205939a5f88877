"""Config fields that never change a causal LM's forward pass: bookkeeping, generation defaults, training.

Every transformers config carries some of these (which ones depends on the transformers version that wrote
the file); nvllm reads none of them for the arithmetic. A field outside this list and outside its family's
own list is refused by name (spec.py): nvllm cannot tell whether it changes the result.
"""

# (_model_name_or_path: where transformers keeps a GGUF file's general.name when it loads one)
BOOKKEEPING = frozenset({
    "_name_or_path", "_model_name_or_path", "_commit_hash", "_attn_implementation_autoset", "transformers_version", "architectures",
    "model_type", "auto_map", "torch_dtype", "dtype", "use_bfloat16", "id2label", "label2id", "problem_type",
    "finetuning_task", "tokenizer_class", "prefix", "task_specific_params", "return_dict", "output_attentions",
    "output_hidden_states", "torchscript", "tf_legacy_loss", "pruned_heads", "chunk_size_feed_forward",
    "is_encoder_decoder", "is_decoder", "add_cross_attention", "cross_attention_hidden_size",
    "tie_encoder_decoder", "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id",
    "decoder_start_token_id", "use_cache",
})

# defaults for generate() that older transformers versions wrote into config.json (the frontend's sampling
# parameters and generation_config.json decide these, never config.json)
GENERATION_DEFAULTS = frozenset({
    "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
    "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty", "length_penalty",
    "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences",
    "output_scores", "return_dict_in_generate", "forced_bos_token_id", "forced_eos_token_id",
    "remove_invalid_values", "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens",
})

# what only training reads
TRAINING = frozenset({"initializer_range", "attention_dropout", "hidden_dropout", "dropout"})

# how an embedding model's vectors may be truncated (Matryoshka): the pooler's business, not the forward pass's
EMBEDDING = frozenset({"is_matryoshka", "matryoshka_dimensions"})

NEVER_CHANGE_OUTPUTS = BOOKKEEPING | GENERATION_DEFAULTS | TRAINING | EMBEDDING

# fields transformers' shared mask, cache and rotary code reads for every architecture (transformers_reads.py):
# field -> (the value every family nvllm runs has, why another is refused); a family that reads one itself
# (Phi-3's partial_rotary_factor, the sliding families' windows) reads it instead
SHARED_FIXED = {
    "is_causal": (True, "nvllm runs causal language models"),
    "attention_chunk_size": (None, "chunked attention (Llama 4's) is not implemented"),
    "kv_sharing_modes": (None, "layers sharing another layer's keys and values are not implemented"),
    "number_of_conv_states": (None, "convolution states (hybrid models) are not implemented"),
    "per_layer_config": (None, "per-layer configurations are not implemented"),
    "partial_rotary_factor": (1.0, "this family rotates every dimension of a head"),
    "layer_types": (None, "this family names no per-layer attention kinds; transformers' cache would slide or "
                          "chunk the layers it names"),
    "sliding_window": (None, "this family attends to every key; transformers' cache would keep only the window"),
}
