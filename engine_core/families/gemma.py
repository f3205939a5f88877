"""Gemma 2's and Gemma 3's config fields, read into ModelSpec values (the family records are in catalog.py).

Gemma differs from Llama in ways that are all data: RMSNorm scales by (1 + weight); the embeddings are scaled by
sqrt(hidden_size); each layer has four norms (the sandwich: after attention and after the MLP as well); the
softmax scale is query_pre_attn_scalar ** -0.5; the MLP's activation is named `hidden_activation`; some layers
attend through a sliding window; the attention scores and the final logits may be soft-capped (cap * tanh(x /
cap)). Gemma 2 alternates sliding and global layers (the first slides) with one rotary base and caps both; Gemma 3
slides five layers of every six by default, gives them their own rotary base, and norms q and k per head.
"""

import math

from engine_core.families import rope_scaling
from engine_core.families.spec import RopeSpec, UnsupportedConfig, activation_of

# what both write beyond the common fields
GEMMA_READS = frozenset({
    "hidden_activation", "query_pre_attn_scalar", "sliding_window", "layer_types", "final_logit_softcapping",
    "attn_logit_softcapping", "use_bidirectional_attention", "attention_bias",
})
GEMMA2_READS = GEMMA_READS
# what Gemma3TextConfig writes beyond those
GEMMA3_READS = GEMMA_READS | {"sliding_window_pattern", "rope_local_base_freq"}
# what transformers' modeling_gemma3 also reads, for the vision tower of its multimodal model, never the text model's
GEMMA3_VISION = {name: "the vision tower's (modeling_gemma3 holds the multimodal model too); the text model never "
                       "reads it" for name in ("image_size", "patch_size", "mm_tokens_per_image", "image_token_id",
                                               "vision_config", "layer_norm_eps", "text_config")}
LOCAL_THETA = 10000.0  # transformers' default rotary base of Gemma 3's sliding layers
GLOBAL_THETA = 1000000.0
GEMMA2_PATTERN = 2  # transformers' Gemma 2 default: layers alternate, sliding first
GEMMA3_PATTERN = 6  # Gemma 3's: five sliding layers, then a global one


def gemma_values(config: dict, pattern: int) -> dict:
    """ModelSpec fields (name -> value) both Gemmas set beyond the ones every family reads; pattern: every
    pattern-th layer is global where the config names no layer_types."""
    if config.get("use_bidirectional_attention"):
        raise UnsupportedConfig("use_bidirectional_attention", True, "nvllm runs causal language models")
    if config.get("attention_bias"):
        raise UnsupportedConfig("attention_bias", True, "Gemma has no attention biases")
    act = config.get("hidden_activation") or config.get("hidden_act") or "gelu_pytorch_tanh"
    return dict(
        activation=activation_of(act),
        norm_offset=1.0,
        embed_scale=math.sqrt(config["hidden_size"]),
        attn_scale=float(config.get("query_pre_attn_scalar", 256)) ** -0.5,
        sandwich_norms=True,
        layer_windows=_windows(config, pattern),
        attn_logit_softcap=_cap(config, "attn_logit_softcapping"),
        final_logit_softcap=_cap(config, "final_logit_softcapping"),
    )


def gemma2_values(config: dict) -> dict:
    """Gemma 2: one rotary base for every layer (the common reader's), both soft caps."""
    return gemma_values(config, GEMMA2_PATTERN)


def gemma3_values(config: dict) -> dict:
    """Gemma 3: its sliding layers' own rotary base."""
    global_rope, local_theta = _rope(config)
    return gemma_values(config, GEMMA3_PATTERN) | dict(rope=global_rope, local_rope_theta=local_theta)


def _cap(config: dict, name: str) -> float | None:
    cap = config.get(name)
    if cap is None:
        return None
    if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap > 0:
        raise UnsupportedConfig(name, cap, "a soft cap is a positive number (null: none)")
    return float(cap)


def _windows(config: dict, default_pattern: int) -> tuple[int | None, ...]:
    """layer_types where written; else (older configs) every sliding_window_pattern-th layer is global."""
    layers = config["num_hidden_layers"]
    kinds = config.get("layer_types")
    if kinds is None:
        pattern = config.get("sliding_window_pattern", default_pattern)
        kinds = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(layers)]
    if len(kinds) != layers:
        raise UnsupportedConfig("layer_types", kinds, f"names {len(kinds)} layers of {layers}")
    unknown = [k for k in kinds if k not in ("sliding_attention", "full_attention")]
    if unknown:
        raise UnsupportedConfig("layer_types", unknown[0], "nvllm implements sliding_attention and full_attention")
    window = config.get("sliding_window")
    if not any(k == "sliding_attention" for k in kinds):
        return ()
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise UnsupportedConfig("sliding_window", window, "a window is a whole number of tokens, 1 or more")
    return tuple(window if k == "sliding_attention" else None for k in kinds)


def _rope(config: dict) -> tuple[RopeSpec, float]:
    """The global layers' rotary (theta, scaling) and the sliding layers' theta: from rope_parameters keyed by
    layer type (newer configs) or rope_theta / rope_local_base_freq / rope_scaling (older ones)."""
    params = config.get("rope_parameters") or {}
    if "full_attention" in params or "sliding_attention" in params:
        full, local = params.get("full_attention") or {}, params.get("sliding_attention") or {}
        global_theta = float(full.get("rope_theta", GLOBAL_THETA))
        local_theta = float(local.get("rope_theta", LOCAL_THETA))
        scaling, local_scaling = full, local
    else:
        global_theta = float(config.get("rope_theta") or GLOBAL_THETA)
        local_theta = float(config.get("rope_local_base_freq", LOCAL_THETA))
        scaling, local_scaling = config.get("rope_scaling") or {}, {}
    local_type = local_scaling.get("rope_type", local_scaling.get("type", "default"))
    if local_type != "default":
        raise UnsupportedConfig("rope_parameters.sliding_attention.rope_type", local_type,
                                "Gemma 3's sliding layers rotate unscaled (transformers, llama.cpp)")
    # the global layers' scaling (linear, factor 8, on the 4B and larger), as any family's; sliding layers take
    # none (ModelSpec.rope_scaling)
    full = {k: v for k, v in scaling.items() if k != "rope_theta"}
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return RopeSpec(theta=global_theta, scaling=rope_scaling.resolve(full, config, head_dim, {})), local_theta
