"""A config's rope_scaling read into the values the rotary tables need (layers/rotary.py), defaults filled in.

Each type reads only its own keys: a key outside them is refused by name, as any unknown config field is.
The defaults are transformers' (modeling_rope_utils), resolved here once from the config, so the tables depend
on this dict alone (e.g. YaRN's and LongRoPE's attention factor come from max_position_embeddings, which the
engine's max_model_len must not change).
"""

import math
from typing import Any

from engine_core.families.errors import UnsupportedConfig

# the keys each rope type reads (rope_type / type name it; rope_theta and partial_rotary_factor: spec.rope_of)
KEYS = {
    "default": frozenset(),
    "linear": frozenset({"factor"}),
    "llama3": frozenset({"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}),
    "yarn": frozenset({"factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale",
                       "mscale_all_dim", "attention_factor", "truncate"}),
    "longrope": frozenset({"short_factor", "long_factor", "factor", "original_max_position_embeddings",
                           "attention_factor"}),
}
REFUSED = {
    # transformers recomputes the frequencies from the longest position of each forward call: a token's rotation
    # would depend on its batch and on how far its sequence has grown, and cached keys would disagree with it
    "dynamic": "dynamic NTK scaling rotates by each call's sequence length, so a token's result would depend on "
               "its sequence's length and batch",
}


def resolve(scaling: dict, config: dict, rotary_dim: int, aliases: dict[str, str]) -> dict[str, Any] | None:
    """scaling: rope_scaling without rope_theta / partial_rotary_factor. None for unscaled rotary."""
    rope_type = scaling.pop("rope_type", None) or scaling.get("type") or "default"
    scaling.pop("type", None)
    rope_type = aliases.get(rope_type, rope_type)
    if rope_type in REFUSED:
        raise UnsupportedConfig("rope_scaling.rope_type", rope_type, REFUSED[rope_type])
    if rope_type not in KEYS:
        raise UnsupportedConfig("rope_scaling.rope_type", rope_type, f"nvllm implements {', '.join(KEYS)}")
    for key in scaling:
        if key not in KEYS[rope_type]:
            raise UnsupportedConfig(f"rope_scaling.{key}", scaling[key], f"not a value nvllm reads for {rope_type}")
    if rope_type == "default":
        return None
    # transformers: a top-level original_max_position_embeddings (Phi-3's) wins over the one in rope_scaling
    original = int(config.get("original_max_position_embeddings") or scaling.get("original_max_position_embeddings")
                   or config["max_position_embeddings"])
    return {"rope_type": rope_type} | _READERS[rope_type](scaling, config, rotary_dim, original)


def _linear(scaling, config, rotary_dim, original):
    return {"factor": float(scaling["factor"])}


def _llama3(scaling, config, rotary_dim, original):
    return {"factor": float(scaling["factor"]), "low_freq_factor": float(scaling.get("low_freq_factor", 1.0)),
            "high_freq_factor": float(scaling.get("high_freq_factor", 4.0)),
            "original_max_position_embeddings": original}


def _mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(scaling, config, rotary_dim, original):
    factor = scaling.get("factor") or config["max_position_embeddings"] / original
    attention = scaling.get("attention_factor")
    if attention is None:
        mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
        attention = (_mscale(factor, mscale) / _mscale(factor, mscale_all_dim) if mscale and mscale_all_dim
                     else _mscale(factor))
    return {"factor": float(factor), "original_max_position_embeddings": original,
            "beta_fast": float(scaling.get("beta_fast") or 32), "beta_slow": float(scaling.get("beta_slow") or 1),
            "truncate": bool(scaling.get("truncate", True)), "attention_factor": float(attention)}


def _longrope(scaling, config, rotary_dim, original):
    for key in ("short_factor", "long_factor"):
        if len(scaling.get(key) or ()) != rotary_dim // 2:
            raise UnsupportedConfig(f"rope_scaling.{key}", scaling.get(key),
                                    f"needs one factor per rotated pair ({rotary_dim // 2})")
    factor = scaling.get("factor") or config["max_position_embeddings"] / original
    attention = scaling.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
    return {"short_factor": [float(f) for f in scaling["short_factor"]],
            "long_factor": [float(f) for f in scaling["long_factor"]],
            "original_max_position_embeddings": original, "attention_factor": float(attention)}


_READERS = {"linear": _linear, "llama3": _llama3, "yarn": _yarn, "longrope": _longrope}
