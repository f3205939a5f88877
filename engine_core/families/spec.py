"""ModelSpec: one model's values, the one record every part of the engine builds the model from.

catalog.read_spec reads config.json (as weights/model_folder.py normalises it) through the model's family
(family.py): every field is either read into a value here, or known never to change the outputs
(config_fields.py, the family's own `ignores`). Anything else is an `UnsupportedConfig` naming the field:
a field nvllm does not know, or a value it does not implement, would otherwise run the wrong arithmetic
without a word.
"""

from typing import Any

import msgspec

# transformers' activation names -> the gated MLP activations nvllm implements
ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh",
               "gelu_new": "gelu_tanh"}
ROPE_TYPES = ("default", "llama3")


class UnsupportedConfig(ValueError):
    """A config.json field nvllm does not know, or a value of it nvllm does not implement."""

    def __init__(self, field: str, value: Any, why: str):
        self.field, self.value = field, value
        super().__init__(f"config.json field {field!r} = {value!r}: {why}")


class RopeSpec(msgspec.Struct, frozen=True, kw_only=True):
    theta: float
    scaling: dict[str, Any] | None = None  # rope_type llama3 and its factors; None: unscaled


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


def rope_of(config: dict) -> RopeSpec:
    scaling = config.get("rope_scaling")
    if scaling:
        rope_type = scaling.get("rope_type", scaling.get("type", "default"))
        if rope_type not in ROPE_TYPES:
            raise UnsupportedConfig("rope_scaling.rope_type", rope_type, f"nvllm implements {', '.join(ROPE_TYPES)}")
        if rope_type == "default":
            scaling = None
    return RopeSpec(theta=float(config["rope_theta"]), scaling=dict(scaling) if scaling else None)
