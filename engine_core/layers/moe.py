"""A sparse mixture-of-experts MLP (Qwen2-MoE, Qwen3-MoE, Mixtral): a router picks each token's experts, and only
those experts run on it.

Routing: a replicated linear to one logit per expert, softmax in float32, the top k, optionally divided by their
sum. Experts run grouped: each expert that got tokens runs its gated MLP once on just those rows, through the
project's linear layers (so every expert gets the packed and quantized CPU kernels); an expert no token chose
does not run. Each token's k results are weighted and added in the token's own top-k order, so a token's sum
never depends on which other tokens share the batch (the linear kernels keep each row's own order too).
GPUs take the same grouped path (no fused MoE kernel yet); its expert counts are read on the host, so a MoE model
does not capture CUDA graphs.

Tensor parallelism: every expert (and Qwen2-MoE's shared expert) splits its intermediate size over the ranks like
the dense MLP (gate/up column-parallel, down row-parallel); the router and the shared expert's gate are
replicated. The partial sums of all experts are added on each rank and all-reduced once.
"""

import torch
from torch import nn

from engine_core.distributed.parallel_state import all_reduce
from engine_core.families.spec import ModelSpec
from engine_core.layers.linear import GateUpLinear, ReplicatedLinear, RowParallelLinear


class ExpertMLP(nn.Module):
    """One expert's gated MLP; its down projection leaves the all-reduce to the MoE layer."""

    def __init__(self, hidden: int, intermediate: int, activation: str):
        super().__init__()
        self.gate_up_proj = GateUpLinear(hidden, intermediate, activation)
        self.down_proj = RowParallelLinear(intermediate, hidden, reduce=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.gate_up_proj(x))


def route(logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, k] float32, experts [T, k]) of each row's k most probable experts, most probable first."""
    probs = torch.softmax(logits.float(), dim=-1)
    weights, experts = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, experts


def run_grouped(x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor, mlps: nn.ModuleList) -> torch.Tensor:
    """sum_j weights[t, j] * mlps[experts[t, j]](x[t]) for each row t, each expert run once on its rows."""
    tokens, top_k = experts.shape
    choices = experts.reshape(-1)  # choice t * k + j: token t's j-th expert
    by_expert = torch.argsort(choices, stable=True)
    counts = torch.bincount(choices, minlength=len(mlps)).tolist()
    results = x.new_empty(tokens * top_k, x.shape[1])
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        picked = by_expert[start:start + count]
        start += count
        results[picked] = mlps[expert](x[picked // top_k])
    results = results.view(tokens, top_k, -1) * weights.to(x.dtype).unsqueeze(-1)
    out = results[:, 0]
    for j in range(1, top_k):  # in the token's own top-k order: a fixed order per row
        out = out + results[:, j]
    return out


class SparseMoeBlock(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        hidden = spec.hidden_size
        self.top_k, self.renormalize = spec.experts_per_token, spec.renormalize_topk
        self.gate = ReplicatedLinear(hidden, spec.num_experts)
        self.experts = nn.ModuleList(ExpertMLP(hidden, spec.moe_intermediate_size, spec.activation)
                                     for _ in range(spec.num_experts))
        self.shared_expert = self.shared_expert_gate = None
        if spec.shared_expert_intermediate_size:
            self.shared_expert = ExpertMLP(hidden, spec.shared_expert_intermediate_size, spec.activation)
            self.shared_expert_gate = ReplicatedLinear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, experts = route(self.gate(x), self.top_k, self.renormalize)
        out = run_grouped(x, experts, weights, self.experts)
        if self.shared_expert is not None:
            # the sigmoid scales this rank's partial sum: the same as scaling the all-reduced one
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return all_reduce(out)
