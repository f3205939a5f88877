"""ModelSpec: one model's values, the one record every part of the engine builds the model from.

catalog.read_spec reads config.json (as weights/model_folder.py normalises it) through the model's family
(family.py): every field is either read into a value here, or known never to change the outputs
(config_fields.py, the family's own `ignores`). Anything else is an `UnsupportedConfig` naming the field:
a field nvllm does not know, or a value it does not implement, would otherwise run the wrong arithmetic
without a word.
"""

from typing import Any

import msgspec

from engine_core.families import rope_scaling
from engine_core.families.errors import UnsupportedConfig

# transformers' activation names -> the gated MLP activations nvllm implements
ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh",
               "gelu_new": "gelu_tanh"}


class RopeSpec(msgspec.Struct, frozen=True, kw_only=True):
    theta: float
    # rope_type and every value its tables need, defaults filled in (rope_scaling.py); None: unscaled
    scaling: dict[str, Any] | None = None
    rotary_dim: int | None = None  # the leading dims of each head that rotate (the rest pass); None: all of them


class ModelSpec(msgspec.Struct, frozen=True, kw_only=True):
    family: str  # a catalog.py family name
    architecture: str  # config.json's architectures entry
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position: int
    norm_eps: float
    norm_offset: float = 0.0  # RMSNorm scales by (norm_offset + weight)
    activation: str = "silu"  # of the gated MLP: silu | gelu | gelu_tanh
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False  # gate, up and down projections
    qk_norm: bool = False  # RMSNorm of q and k per head before the rotary embedding
    tie_word_embeddings: bool = False
    rope: RopeSpec
    # per layer, the keys a query sees through its sliding window (positions p - w + 1 .. p), None: all
    # keys before it; () where no layer slides (families/windows.py reads these)
    layer_windows: tuple[int | None, ...] = ()
    attn_logit_softcap: float | None = None
    final_logit_softcap: float | None = None
    # mixture of experts (families/moe_fields.py); num_experts 0: every layer's MLP is dense
    num_experts: int = 0  # routed experts of a sparse layer
    experts_per_token: int = 0  # top-k of the router's softmax
    renormalize_topk: bool = False  # the k weights divided by their sum (Mixtral always; Qwen: norm_topk_prob)
    moe_intermediate_size: int = 0  # each routed expert's gated MLP
    shared_expert_intermediate_size: int = 0  # Qwen2-MoE's always-on expert, scaled by a sigmoid gate; 0: none
    sparse_layers: tuple[int, ...] = ()  # layers whose MLP is the MoE; the others keep the dense intermediate_size
    # Gemma's differences (families/gemma.py reads them)
    embed_scale: float | None = None  # embeddings times this (rounded to the model's dtype, as transformers does)
    attn_scale: float | None = None  # the attention's softmax scale; None: head_dim ** -0.5
    sandwich_norms: bool = False  # norms after attention and MLP too, and one before the MLP (Gemma's four)
    local_rope_theta: float | None = None  # the rotary base of sliding-window layers; None: rope.theta

    def window(self, layer: int) -> int | None:
        """Layer `layer`'s sliding window, or None where it attends to every key before the query."""
        return self.layer_windows[layer] if self.layer_windows else None

    @property
    def every_layer_slides(self) -> bool:
        """Keys older than the widest window are read by no layer (the scheduler may free their blocks)."""
        return bool(self.layer_windows) and all(w is not None for w in self.layer_windows)

    def rope_theta(self, layer: int) -> float:
        """Layer `layer`'s rotary base (Gemma 3's sliding layers have their own)."""
        if self.local_rope_theta is not None and self.window(layer) is not None:
            return self.local_rope_theta
        return self.rope.theta

    def rope_scaling(self, layer: int) -> dict[str, Any] | None:
        """Layer `layer`'s rotary scaling: a sliding layer with a rotary base of its own (Gemma 3's) is unscaled, as
        in transformers (rope_parameters.sliding_attention) and llama.cpp; every other layer takes rope.scaling."""
        if self.local_rope_theta is not None and self.window(layer) is not None:
            return None
        return self.rope.scaling

    def window(self, layer: int) -> int | None:
        """Layer `layer`'s sliding window, or None where it attends to every key before the query."""
        return self.layer_windows[layer] if self.layer_windows else None

    @property
    def every_layer_slides(self) -> bool:
        return bool(self.layer_windows) and all(w is not None for w in self.layer_windows)

    @property
    def attention_reach(self) -> int | None:
        """The most keys any layer's query reads, itself included (the widest window), where every layer slides;
        None where some layer reads all keys. Older keys are read by no layer: the scheduler frees their blocks."""
        return max(self.layer_windows) if self.every_layer_slides else None


def activation_of(name: Any) -> str:
    if name not in ACTIVATIONS:
        raise UnsupportedConfig("hidden_act", name, f"nvllm implements {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name]


def rope_of(config: dict, partial_rotary: bool = False, aliases: dict[str, str] | None = None) -> RopeSpec:
    """The rotary embedding of a normalised config.json. partial_rotary: the family reads partial_rotary_factor
    (Phi-3); aliases: the family's older names of rope types (Phi-3's "su")."""
    scaling = dict(config.get("rope_scaling") or {})
    factor = scaling.pop("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))
    if factor != 1.0 and not partial_rotary:
        raise UnsupportedConfig("partial_rotary_factor", factor, "this family rotates whole heads")
    rotary_dim = int(config["head_dim"] * factor)
    if rotary_dim <= 0 or rotary_dim % 2:
        raise UnsupportedConfig("partial_rotary_factor", factor,
                                f"{rotary_dim} rotated dims: not a positive even number")
    theta = float(scaling.pop("rope_theta", None) or config["rope_theta"])
    return RopeSpec(theta=theta, scaling=rope_scaling.resolve(scaling, config, rotary_dim, aliases or {}),
                    rotary_dim=None if rotary_dim == config["head_dim"] else rotary_dim)


def for_context(spec: ModelSpec, max_model_len: int) -> ModelSpec:
    """The spec of a model instance that runs sequences of up to max_model_len tokens: its rotary tables hold that
    many positions, and LongRoPE takes its long factors only where that passes the original context (rotary.py)."""
    return msgspec.structs.replace(spec, max_position=min(spec.max_position, max_model_len))
