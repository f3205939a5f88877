"""llama.cpp's gemma2 and gemma3 GGUF files read as transformers' Gemma2ForCausalLM / Gemma3ForCausalLM folders.

What llama.cpp's converter changes, for both: it adds 1 to every norm weight (*norm.weight, Gemma 3's q/k norms
and the final norm included), since llama.cpp's RMSNorm scales by the weight and Gemma's by 1 + weight; the
import subtracts it, as transformers' own GGUF loader does, so the folder holds HF's values. Each layer's four
norms have names of their own (GEMMA_BLOCK_NAMES): llama's ffn_norm is the norm after attention, Gemma's the one
before the MLP.

What the files do not say, and where nvllm takes it from (llama.cpp's graph is what a file was made to run with):
- which layers slide: llama.cpp's graphs fix it (no key). Gemma 2 alternates, the first layer sliding; Gemma 3
  slides five layers of every six. transformers' config defaults agree with both; written out as layer_types;
- query_pre_attn_scalar: llama.cpp's rule, head_dim, except for each generation's 27B (46 and 62 layers), whose
  scale is hidden / heads. transformers' GGUF loader leaves the config's default 256, which equals head_dim for
  the released 2B, 9B, 1B, 4B and 12B but neither 27B, nor any other head size;
- the activation: gelu (tanh approximation), as both run it;
- Gemma 2's window (llama.cpp: 4096 when the key is missing) and soft caps (gemma2.attn_logit_softcapping,
  gemma2.final_logit_softcapping; llama.cpp's defaults 50 and 30, every released Gemma 2's values, when missing);
  its single rotary base (rope.freq_base, which the converter does not write: 10000, llama.cpp's default);
- Gemma 3's sliding layers' rotary base: 10000 in llama.cpp's graph and in transformers' defaults alike; soft
  caps: none (llama.cpp's gemma3 graph applies none whatever the file says). rope.scaling.* (linear, factor 8 on
  the 4B and larger) applies to the global layers only, as in llama.cpp and transformers; it is written into
  rope_parameters.full_attention, where families/gemma.py reads it.
"""

from engine_core.families.gemma import GEMMA2_PATTERN, GEMMA3_PATTERN, LOCAL_THETA

GEMMA_BLOCK_NAMES = {
    "ffn_norm": "pre_feedforward_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
NORM_SHIFT = 1.0  # what the converter adds to every norm weight
LLAMA_CPP_27B_LAYERS = {"gemma2": 46, "gemma3": 62}  # the layer counts llama.cpp takes for each 27B
GEMMA2_WINDOW = 4096  # llama.cpp's when a gemma2 file names none
GEMMA2_CAPS = {"attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0}  # llama.cpp's defaults


def gemma_fields(arch: str, config: dict, key) -> dict:
    """`config` (the fields every architecture has, from the file's metadata) with the Gemma generation's own;
    `key(name)` reads the file's <arch>.<name> metadata."""
    return _gemma2_fields(config, key) if arch == "gemma2" else _gemma3_fields(config, key)


def _common(arch: str, config: dict, window: int, pattern: int) -> dict:
    layers, head_dim = config["num_hidden_layers"], config["head_dim"]
    hidden_per_head = config["hidden_size"] // config["num_attention_heads"]
    return dict(config) | {
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_activation": "gelu_pytorch_tanh",
        "query_pre_attn_scalar": hidden_per_head if layers == LLAMA_CPP_27B_LAYERS[arch] else head_dim,
        "sliding_window": int(window),
        "layer_types": ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(layers)],
    }


def _gemma2_fields(config: dict, key) -> dict:
    out = _common("gemma2", config, key("attention.sliding_window") or GEMMA2_WINDOW, GEMMA2_PATTERN)
    if out.get("rope_scaling"):
        raise ValueError("the gemma2 GGUF names rope.scaling, which llama.cpp's gemma2 graph does not apply")
    return out | {name: float(key(name) or default) for name, default in GEMMA2_CAPS.items()}


def _gemma3_fields(config: dict, key) -> dict:
    window = key("attention.sliding_window")
    if not window:
        raise ValueError("the gemma3 GGUF names no gemma3.attention.sliding_window, which llama.cpp requires")
    out = _common("gemma3", config, window, GEMMA3_PATTERN)
    scaling = out.pop("rope_scaling", None) or {}  # rope.scaling.*: the global layers' alone
    full_rope = {"rope_type": "default", "rope_theta": out.pop("rope_theta")} | scaling
    out["rope_parameters"] = {"full_attention": full_rope,
                              "sliding_attention": {"rope_type": "default", "rope_theta": LOCAL_THETA}}
    return out
