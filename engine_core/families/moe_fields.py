"""The mixture-of-experts fields of a config.json: how many experts, how a token picks them, which layers are sparse.

Two layouts: the Qwen MoE families (Qwen2-MoE, Qwen3-MoE) name their expert MLP size `moe_intermediate_size`,
choose renormalisation (`norm_topk_prob`) and sparse layers (`decoder_sparse_step`, `mlp_only_layers`), and
Qwen2-MoE adds a shared expert; Mixtral's experts are every layer's MLP, `intermediate_size` wide, and its
top-k weights are always renormalised.
"""

from engine_core.families.spec import UnsupportedConfig

QWEN_MOE_FIELDS = frozenset({"num_experts", "num_local_experts", "num_experts_per_tok", "norm_topk_prob",
                             "moe_intermediate_size", "decoder_sparse_step", "mlp_only_layers"})
SHARED_EXPERT_FIELDS = frozenset({"shared_expert_intermediate_size"})
MIXTRAL_FIELDS = frozenset({"num_local_experts", "num_experts", "num_experts_per_tok", "sliding_window"})

# the router's training terms: transformers adds them to the loss only, never to the logits
ROUTER_TRAINING = {
    "router_aux_loss_coef": "the load-balancing loss's weight, added to the training loss only",
    "output_router_logits": "returns the router logits for that loss; the forward pass is the same",
}
MIXTRAL_TRAINING = ROUTER_TRAINING | {
    "router_jitter_noise": "transformers multiplies the router input by noise only while training",
}


def moe_values(config: dict, layout: str | None) -> dict:
    """The ModelSpec's MoE values for a config of `layout` ("qwen", "mixtral"; None: a dense family)."""
    if layout is None:
        return {}
    layers = config["num_hidden_layers"]
    # transformers 5 writes Qwen3-MoE's expert count as num_local_experts; released configs say num_experts
    experts = config.get("num_experts", config.get("num_local_experts"))
    top_k = config.get("num_experts_per_tok")
    if not experts or not top_k:
        raise UnsupportedConfig("num_experts" if not experts else "num_experts_per_tok", experts if not experts else
                                top_k, "a mixture-of-experts model needs experts and experts per token")
    if top_k > experts:
        raise UnsupportedConfig("num_experts_per_tok", top_k, f"more than the {experts} experts")
    if layout == "mixtral":
        return dict(num_experts=experts, experts_per_token=top_k, renormalize_topk=True,
                    moe_intermediate_size=config["intermediate_size"], sparse_layers=tuple(range(layers)))
    step = config.get("decoder_sparse_step", 1)
    if not isinstance(step, int) or step < 1:
        raise UnsupportedConfig("decoder_sparse_step", step, "a whole number of layers, at least 1")
    dense = set(config.get("mlp_only_layers") or [])
    return dict(num_experts=experts, experts_per_token=top_k, renormalize_topk=bool(config.get("norm_topk_prob")),
                moe_intermediate_size=config["moe_intermediate_size"],
                shared_expert_intermediate_size=config.get("shared_expert_intermediate_size") or 0,
                sparse_layers=tuple(i for i in range(layers) if i not in dense and (i + 1) % step == 0))
