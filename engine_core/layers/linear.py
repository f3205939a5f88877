"""Linear layers with tensor parallelism built in.

Column-parallel layers split output features over ranks (no communication); row-parallel layers
split input features and all-reduce their partial sums. Each parameter has a `weight_loader` that
takes the full checkpoint tensor and keeps only this rank's shard. Splits that do not divide go
as evenly as possible (parallel_state.split_evenly); with one rank every shard is the whole tensor.
"""

import torch
from torch import nn

from engine_core.distributed.parallel_state import all_reduce, partition_heads, split_evenly, tp_rank, tp_size
from engine_core.layers import cpu_packing
from engine_core.cpu_kernels.linear import dense_linear, quant_bf16_dot
from engine_core.cpu_kernels.ops import fused_ops
from engine_core.layers.activation import act_and_mul
from engine_core.layers.forward_context import lora_step


def with_lora(layer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """y plus the LoRA deltas of the step's adapter rows, where the layer has adapter slots (lora/layers.py)."""
    if layer.lora is None:
        return y
    step = lora_step()
    return layer.lora.add_delta(x, y, step) if step is not None else y


class ColumnParallelLinear(cpu_packing.PackableWeight, nn.Module):
    lora = None  # a LoRALayer (lora/layers.py) where LoRA serving gave the layer adapter slots

    def __init__(self, in_features: int, out_features: int, bias: bool = False, out_per_rank: int | None = None):
        super().__init__()
        self.out_start, count = split_evenly(out_features, tp_size(), tp_rank())
        self.out_per_rank = count if out_per_rank is None else out_per_rank
        self.weight = nn.Parameter(torch.empty(self.out_per_rank, in_features), requires_grad=False)
        self.weight.weight_loader = self.weight_loader
        self.bias = None
        if bias:
            self.bias = nn.Parameter(torch.empty(self.out_per_rank), requires_grad=False)
            self.bias.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        param.data.copy_(loaded.narrow(0, self.out_start, self.out_per_rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return with_lora(self, x, self.matmul(x, self.bias))


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel projections of the same input in one matmul (gate and up).
    Each projection is split on its own, so this rank's output is [its gate rows, its up rows]."""

    def __init__(self, in_features: int, out_sizes: list[int], bias: bool = False):
        self.out_sizes = out_sizes
        self.shards = [split_evenly(n, tp_size(), tp_rank()) for n in out_sizes]
        super().__init__(in_features, sum(out_sizes), bias, out_per_rank=sum(c for _, c in self.shards))

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: int | None = 0) -> None:
        """One projection's checkpoint rows (shard_id its index), or None: all of them stacked, as checkpoints
        that store them fused do (Phi-3's gate_up_proj: gate rows, then up rows)."""
        if shard_id is None:
            for index, piece in enumerate(loaded.split(self.out_sizes)):
                self.weight_loader(param, piece, index)
            return
        start, count = self.shards[shard_id]
        offset = sum(c for _, c in self.shards[:shard_id])
        param.data.narrow(0, offset, count).copy_(loaded.narrow(0, start, count))


class GateUpLinear(MergedColumnParallelLinear):
    """A gated MLP's gate and up projections with activation(gate) * up applied: [T, in] -> [T, intermediate].
    With SiLU on AVX512-BF16 CPUs the product is formed in the matmul's epilogue (dense_linear.GatedPanelWeight), so
    the [T, 2 * intermediate] projection output is never written out and read back."""

    def __init__(self, in_features: int, intermediate: int, activation: str = "silu", bias: bool = False):
        super().__init__(in_features, [intermediate, intermediate], bias)
        self.activation = activation

    def packed_form(self, weight: torch.Tensor):
        table = fused_ops.silu_table() if self.activation == "silu" and self.lora is None else None
        if table is None or not dense_linear.can_pack_gated(weight):
            return super().packed_form(weight)
        return dense_linear.GatedPanelWeight(weight, table)

    def quantized_form(self, weight: quant_bf16_dot.QuantizedTensor, dtype: torch.dtype):
        table = fused_ops.silu_table() if self.activation == "silu" and self.lora is None else None
        if (table is None or weight.shape[0] % (4 * dense_linear.LANES) or dtype is not torch.bfloat16
                or not quant_bf16_dot.can_pack(weight)):
            return super().quantized_form(weight, dtype)
        return quant_bf16_dot.GatedQuantPanelWeight(weight, table)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if isinstance(self.packed_weight, (dense_linear.GatedPanelWeight, quant_bf16_dot.GatedQuantPanelWeight)):
            return self.packed_weight.silu_and_mul(x, self.bias)
        return act_and_mul(with_lora(self, x, self.matmul(x, self.bias)), self.activation)


class QKVParallelLinear(ColumnParallelLinear):
    """q, k and v projections in one matmul, over this rank's heads (parallel_state.partition_heads):
    KV heads split as evenly as possible, or replicated when there are fewer KV heads than ranks."""

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool = False):
        self.head_dim = head_dim
        self.heads = partition_heads(num_heads, num_kv_heads, tp_rank(), tp_size())
        self.num_heads = self.heads.num_q
        self.num_kv_heads = self.heads.num_kv
        self.num_kv_heads_total = num_kv_heads
        self.heads_total = num_heads
        out = (num_heads + 2 * num_kv_heads) * head_dim
        super().__init__(hidden_size, out, bias, out_per_rank=(self.num_heads + 2 * self.num_kv_heads) * head_dim)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | None = "q") -> None:
        """The checkpoint's q, k or v rows (shard_id), or None: all three stacked (q;k;v, every head), as
        checkpoints that store them fused do (Phi-3's qkv_proj); this rank keeps its heads of each."""
        d = self.head_dim
        if shard_id is None:
            sizes = [self.heads_total * d, self.num_kv_heads_total * d, self.num_kv_heads_total * d]
            for piece, shard in zip(loaded.split(sizes), "qkv"):
                self.weight_loader(param, piece, shard)
            return
        q_size, kv_size = self.num_heads * d, self.num_kv_heads * d
        if shard_id == "q":
            offset, start, size = 0, self.heads.q_start * d, q_size
        else:
            offset = q_size if shard_id == "k" else q_size + kv_size
            start, size = self.heads.kv_start * d, kv_size
        param.data.narrow(0, offset, size).copy_(loaded.narrow(0, start, size))


class ReplicatedLinear(cpu_packing.PackableWeight, nn.Module):
    """The whole weight on every rank (a MoE router: each rank routes every token itself, the same way)."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        param.data.copy_(loaded)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.matmul(x)


class RowParallelLinear(cpu_packing.PackableWeight, nn.Module):
    """Input features split over ranks (evenly, or the slice [input_start, input_start + input_size)
    given by the caller, e.g. the rows of this rank's attention heads); outputs all-reduced, unless the
    caller sums several partial products first (`reduce=False`: a MoE layer's experts, one all-reduce in all)."""

    lora = None  # a LoRALayer (lora/layers.py) where LoRA serving gave the layer adapter slots

    def __init__(self, in_features: int, out_features: int, bias: bool = False,
                 input_start: int | None = None, input_size: int | None = None, reduce: bool = True):
        super().__init__()
        if bias and not reduce:
            raise ValueError("a bias is added after the all-reduce: the caller of reduce=False would have to add it")
        self.reduce = reduce
        if input_start is None:
            input_start, input_size = split_evenly(in_features, tp_size(), tp_rank())
        self.in_start, self.in_per_rank = input_start, input_size
        self.weight = nn.Parameter(torch.empty(out_features, self.in_per_rank), requires_grad=False)
        self.weight.weight_loader = self.weight_loader
        self.bias = None
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False)
            self.bias.weight_loader = lambda p, w, s=None: p.data.copy_(w)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        param.data.copy_(loaded.narrow(1, self.in_start, self.in_per_rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.matmul(x)
        if not self.reduce:
            return y
        y = all_reduce(y)
        # the bias is added once, after the sum of the partial products; a LoRA delta too (every rank adds the same)
        return with_lora(self, x, y + self.bias if self.bias is not None else y)
