"""llama.cpp's gemma3 GGUF files (Gemma 3's text model) read as transformers' Gemma3ForCausalLM folder.

What llama.cpp's converter changes: it adds 1 to every norm weight (*norm.weight, q/k norms and the final norm
included), since llama.cpp's RMSNorm scales by the weight and Gemma's by 1 + weight; the import subtracts it, as
transformers' own GGUF loader does, so the folder holds HF's values. Each layer's four norms have names of their
own (GEMMA3_BLOCK_NAMES); llama's ffn_norm is the norm after attention, Gemma's the one before the MLP.

What the file does not say, and where nvllm takes it from:
- the sliding pattern: llama.cpp's gemma3 graph fixes it (five sliding layers, then a global one; no key), and
  transformers' Gemma3TextConfig defaults to the same, so both agree: written out as layer_types;
- the sliding layers' rotary base: 10000 in llama.cpp's graph and in transformers' defaults alike;
- query_pre_attn_scalar: llama.cpp's rule, head_dim (hidden / heads for its 62-layer 27B). transformers' loader
  leaves Gemma3TextConfig's default 256, which equals head_dim for the 1B, 4B and 12B checkpoints but not the
  27B's (168) nor any other head size; llama.cpp's rule is what the file was made to run with, and matches every
  published Gemma 3 config.json;
- the activation: gelu (tanh approximation), as both run it;
- soft caps: none (Gemma 3 has none; llama.cpp's gemma3 graph applies none whatever the file says).
rope.scaling.* (linear, factor 8 on the 4B and larger) applies to the global layers only, as in llama.cpp and
transformers; it is written into rope_parameters.full_attention, where families/gemma.py reads it.
"""

from engine_core.families.gemma import LOCAL_THETA

GEMMA3_BLOCK_NAMES = {
    "ffn_norm": "pre_feedforward_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
NORM_SHIFT = 1.0  # what the converter adds to every norm weight
SLIDING_PATTERN = 6  # every sixth layer global, the rest sliding (llama.cpp's set_swa_pattern(6))
LLAMA_CPP_27B_LAYERS = 62  # the layer count llama.cpp takes for the 27B, whose attention scale is hidden / heads


def gemma3_fields(config: dict, key) -> dict:
    """`config` (the fields every architecture has, from the file's metadata) with Gemma 3's own; `key(name)`
    reads the file's gemma3.<name> metadata."""
    window = key("attention.sliding_window")
    if not window:
        raise ValueError("the gemma3 GGUF names no gemma3.attention.sliding_window, which llama.cpp requires")
    layers, head_dim = config["num_hidden_layers"], config["head_dim"]
    scalar = config["hidden_size"] // config["num_attention_heads"] if layers == LLAMA_CPP_27B_LAYERS else head_dim
    out = dict(config)
    scaling = out.pop("rope_scaling", None) or {}  # rope.scaling.*: the global layers' alone
    full_rope = {"rope_type": "default", "rope_theta": out.pop("rope_theta")} | scaling
    out |= {
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_activation": "gelu_pytorch_tanh",
        "query_pre_attn_scalar": scalar,
        "sliding_window": int(window),
        "layer_types": ["full_attention" if (i + 1) % SLIDING_PATTERN == 0 else "sliding_attention"
                        for i in range(layers)],
        "rope_parameters": {"full_attention": full_rope,
                            "sliding_attention": {"rope_type": "default", "rope_theta": LOCAL_THETA}},
    }
    return out
