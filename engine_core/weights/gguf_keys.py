"""Which GGUF metadata keys matter for a file's architecture: the ones llama.cpp's loader reads (llama.cpp is the
reference for GGUF files, as transformers is for config.json).

LLAMA_CPP_READS lists them per architecture, derived from llama.cpp's source at LLAMA_CPP_COMMIT: every key
`llama_model_base::load_hparams` (src/llama-model.cpp) and the architecture's own `load_arch_hparams`
(src/models/<arch>.cpp) read, the vocabulary loader's (src/llama-vocab.cpp) and the model loader's general and
split keys. Graph code reads none. "{arch}" stands for general.architecture.

A key llama.cpp never reads for the architecture (the converter's descriptive general.* keys, its yarn beta keys,
expert_weights_norm where the graph fixes the routing) is ignored, with a debug line naming it. A key it reads is
honoured by gguf_import.py (HONOURED), known not to change nvllm's outputs (HARMLESS), or refused by name at any
value other than the one nvllm runs (INERT, llama.cpp's default or the value it must equal).
"""

import logging
from typing import Any, Callable, Iterable

logger = logging.getLogger(__name__)

LLAMA_CPP_COMMIT = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"  # build b11312, 2026-10-01

_COMMON = frozenset({
    "general.architecture", "general.name", "general.file_type", "general.alignment", "general.tensor_extra.name",
    "general.tensor_extra.prec_a4", "split.count", "split.no", "split.tensors.count",
    "{arch}.context_length", "{arch}.embedding_length", "{arch}.embedding_length_out", "{arch}.attention.causal",
    "{arch}.pooling_type", "{arch}.classifier.pooling_type", "{arch}.block_count", "{arch}.nextn_predict_layers",
    "{arch}.expert_count", "{arch}.expert_used_count", "{arch}.expert_group_count", "{arch}.expert_group_used_count",
    "{arch}.feed_forward_length", "{arch}.attention.head_count", "{arch}.attention.head_count_kv",
    "{arch}.rope.scaling.finetuned", "{arch}.rope.scaling.original_context_length", "{arch}.rope.freq_base",
    "{arch}.rope.scaling.type", "{arch}.rope.scaling.factor", "{arch}.rope.scale_linear",
    "{arch}.rope.scaling.attn_factor", "{arch}.rope.scaling.alpha", "{arch}.attention.key_length",
    "{arch}.attention.value_length", "{arch}.rope.dimension_count", "{arch}.attention.key_length_swa",
    "{arch}.attention.value_length_swa", "{arch}.rope.dimension_count_swa", "{arch}.classifier.output_labels",
    "{arch}.vocab_size", "{arch}.attention.layer_norm_rms_epsilon",
    "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.token_type_count", "tokenizer.ggml.merges",
    "tokenizer.ggml.precompiled_charsmap", "tokenizer.ggml.add_space_prefix", "tokenizer.ggml.remove_extra_whitespaces",
    "tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type", "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id",
    "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.seperator_token_id", "tokenizer.ggml.padding_token_id",
    "tokenizer.ggml.mask_token_id", "tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.fim_suf_token_id",
    "tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.fim_pad_token_id", "tokenizer.ggml.fim_rep_token_id",
    "tokenizer.ggml.fim_sep_token_id", "tokenizer.ggml.prefix_token_id", "tokenizer.ggml.suffix_token_id",
    "tokenizer.ggml.middle_token_id", "tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token",
    "tokenizer.ggml.add_sep_token", "tokenizer.ggml.normalizer.lowercase", "tokenizer.ggml.normalizer.strip_accents",
    "tokenizer.ggml.suppress_tokens", "tokenizer.chat_template",
})
_GEMMA = frozenset({"{arch}.attention.sliding_window", "{arch}.attention.sliding_window_pattern",
                    "{arch}.rope.freq_base_swa", "{arch}.final_logit_softcapping"})
LLAMA_CPP_READS = {
    "llama": _COMMON,
    "qwen2": _COMMON,
    "qwen3": _COMMON,
    "gemma2": _COMMON | _GEMMA | {"{arch}.attn_logit_softcapping"},
    "gemma3": _COMMON | _GEMMA,
    "phi3": _COMMON | {"{arch}.attention.sliding_window"},
    "qwen2moe": _COMMON | {"{arch}.expert_feed_forward_length", "{arch}.expert_shared_feed_forward_length"},
    "qwen3moe": _COMMON | {"{arch}.expert_feed_forward_length"},
}
CHAT_TEMPLATES = "tokenizer.chat_template."  # tokenizer.chat_template.<name>: named templates, read too

# what gguf_import.py reads into the config (rope.dimension_count: Phi-3's rotated dims; elsewhere INERT)
HONOURED = frozenset({
    "general.architecture", "{arch}.context_length", "{arch}.embedding_length", "{arch}.block_count",
    "{arch}.feed_forward_length", "{arch}.attention.head_count", "{arch}.attention.head_count_kv",
    "{arch}.attention.key_length", "{arch}.attention.layer_norm_rms_epsilon", "{arch}.rope.freq_base",
    "{arch}.vocab_size", "{arch}.expert_count", "{arch}.expert_used_count", "{arch}.expert_feed_forward_length",
    "{arch}.expert_shared_feed_forward_length", "{arch}.attention.sliding_window", "{arch}.rope.scaling.type",
    "{arch}.rope.scaling.factor", "{arch}.rope.scaling.original_context_length", "{arch}.rope.scaling.attn_factor",
    "{arch}.rope.scale_linear", "{arch}.attn_logit_softcapping", "tokenizer.ggml.model", "tokenizer.ggml.tokens",
    "tokenizer.chat_template", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.padding_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id",
})

_TOKENIZER = "read by transformers' GGUF tokenizer conversion, which writes the tokenizer nvllm serves"
HARMLESS = {
    "general.name": "a label", "general.file_type": "names the usual block type; each tensor's own type is read",
    "general.alignment": "gguf-py's reader applies it to the tensor data",
    "{arch}.rope.scaling.finetuned": "a note that the model was tuned at the scaled length",
    "{arch}.pooling_type": "how llama.cpp pools an embedding model's states: --runner pooling and --pooler-config "
                           "choose that in nvllm, and generation never pools",
    **{key: _TOKENIZER for key in (
        "tokenizer.ggml.pre", "tokenizer.ggml.token_type_count", "tokenizer.ggml.merges",
        "tokenizer.ggml.precompiled_charsmap", "tokenizer.ggml.add_space_prefix",
        "tokenizer.ggml.remove_extra_whitespaces", "tokenizer.ggml.scores", "tokenizer.ggml.token_type",
        "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.seperator_token_id", "tokenizer.ggml.mask_token_id",
        "tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.fim_mid_token_id",
        "tokenizer.ggml.fim_pad_token_id", "tokenizer.ggml.fim_rep_token_id", "tokenizer.ggml.fim_sep_token_id",
        "tokenizer.ggml.prefix_token_id", "tokenizer.ggml.suffix_token_id", "tokenizer.ggml.middle_token_id",
        "tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token", "tokenizer.ggml.add_sep_token",
        "tokenizer.ggml.normalizer.lowercase", "tokenizer.ggml.normalizer.strip_accents")},
}


def _absent_or(value: Any) -> Callable[[Any, dict], bool]:
    return lambda got, facts: got is None or got == value


def _equals(fact: str) -> Callable[[Any, dict], bool]:
    return lambda got, facts: got is None or got == facts[fact]


# key -> (whether a value is the one nvllm runs, given facts of the file, why another is refused)
INERT: dict[str, tuple[Callable[[Any, dict], bool], str]] = {
    "{arch}.attention.causal": (_absent_or(True), "nvllm runs causal language models"),
    "{arch}.embedding_length_out": (_equals("hidden"), "an output width other than the hidden size"),
    "{arch}.nextn_predict_layers": (_absent_or(0), "multi-token-prediction layers are not implemented"),
    "{arch}.expert_group_count": (_absent_or(0), "grouped expert routing is not implemented"),
    "{arch}.expert_group_used_count": (_absent_or(0), "grouped expert routing is not implemented"),
    "{arch}.classifier.pooling_type": (_absent_or(None), "classifier heads are not implemented"),
    "{arch}.classifier.output_labels": (_absent_or(None), "classifier heads are not implemented"),
    "{arch}.rope.scaling.alpha": (_absent_or(None), "NTK-alpha rope scaling is not implemented"),
    "{arch}.attention.value_length": (_equals("head_dim"), "value heads of another width than the key heads"),
    "{arch}.attention.key_length_swa": (_equals("head_dim"), "sliding layers with other head widths"),
    "{arch}.attention.value_length_swa": (_equals("head_dim"), "sliding layers with other head widths"),
    "{arch}.rope.dimension_count_swa": (_equals("rotary_dim"), "sliding layers rotating other dimensions"),
    "{arch}.rope.dimension_count": (_equals("rotary_dim"), "rotating only part of each head is implemented for "
                                                           "phi3 files only"),
    "{arch}.attention.sliding_window_pattern": (_equals("window_pattern"), "nvllm's Gemma import lays out llama.cpp's "
                                                                           "default pattern only"),
    "{arch}.rope.freq_base_swa": (_equals("local_theta"), "nvllm's Gemma import uses llama.cpp's default rotary base "
                                                          "for sliding layers only"),
    "{arch}.final_logit_softcapping": (_equals("final_softcap"), "a final soft cap llama.cpp's graph for this "
                                                                 "architecture does not apply"),
    "tokenizer.ggml.suppress_tokens": (_absent_or(None), "tokens never sampled are not implemented"),
    "general.tensor_extra.name": (_absent_or(None), "per-tensor extras are not implemented"),
    "general.tensor_extra.prec_a4": (_absent_or(None), "per-tensor extras are not implemented"),
    "split.count": (_absent_or(1), "a model split over several files: merge them into one (llama-gguf-split "
                                   "--merge)"),
    "split.no": (_absent_or(0), "a part of a split model: merge the parts into one (llama-gguf-split --merge)"),
    "split.tensors.count": (_absent_or(None), "a part of a split model: merge the parts into one"),
}


def check_keys(keys: Iterable[str], value: Callable[[str], Any], arch: str, facts: dict[str, Any]) -> None:
    """ValueError naming the first key llama.cpp reads for `arch` that nvllm does not honour, at a value it does
    not run; keys: the file's metadata keys, value(key) its value (read only where checked: a vocabulary is
    large); facts: what the import runs (hidden, head_dim, rotary_dim, window_pattern, local_theta,
    final_softcap: the values the INERT keys must equal)."""
    read = {template.format(arch=arch): template for template in LLAMA_CPP_READS[arch]}
    for key in keys:
        template = read.get(key) or (key if key.startswith(CHAT_TEMPLATES) else None)
        if template is None:
            logger.debug("GGUF key %s: llama.cpp's %s never reads it; ignored", key, arch)
        elif template in INERT:
            runs, why = INERT[template]
            if not runs(value(key), facts):
                raise ValueError(f"the GGUF names {key} = {value(key)!r}: {why}")
        elif not (template in HONOURED or template in HARMLESS or template.startswith(CHAT_TEMPLATES)):
            raise ValueError(f"the GGUF names {key} = {value(key)!r}, which llama.cpp's {arch} reads and nvllm does "
                             "not implement")
