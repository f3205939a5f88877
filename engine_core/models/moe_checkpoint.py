"""Checkpoint names of mixture-of-experts tensors, as the decoder's modules (layers/moe.py) name them.

Released checkpoints keep one 2-D tensor per expert: Qwen's `mlp.experts.N.{gate,up,down}_proj.weight`, Mixtral's
`block_sparse_moe.experts.N.w1/w3/w2.weight` (gate, up, down) and `block_sparse_moe.gate.weight` (the router).
transformers 5 holds an MoE layer's experts fused, as 3-D tensors `mlp.experts.gate_up_proj` [experts, 2 * I,
hidden] (gate rows, then up rows) and `mlp.experts.down_proj` [experts, hidden, I]; a checkpoint written in
that form is split back here into the per-expert tensors.
"""

import re
from typing import Iterable, Iterator

import torch

_MIXTRAL_NAMES = ((".block_sparse_moe.", ".mlp."), (".w1.", ".gate_proj."), (".w3.", ".up_proj."),
                  (".w2.", ".down_proj."))
_FUSED = re.compile(r"(.*\.mlp\.experts)\.(gate_up_proj|down_proj)(\.weight)?$")


def per_expert(weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors with Mixtral's names in Qwen's form and fused 3-D experts split per expert."""
    for name, tensor in weights:
        if ".block_sparse_moe." in name:
            for old, new in _MIXTRAL_NAMES:
                name = name.replace(old, new)
        fused = _FUSED.match(name)
        if fused is None:
            yield name, tensor
            continue
        prefix, kind = fused.group(1), fused.group(2)
        for expert, matrix in enumerate(tensor.unbind(0)):
            if kind == "down_proj":
                yield f"{prefix}.{expert}.down_proj.weight", matrix
            else:
                gate, up = matrix.chunk(2, dim=0)
                yield f"{prefix}.{expert}.gate_proj.weight", gate
                yield f"{prefix}.{expert}.up_proj.weight", up
