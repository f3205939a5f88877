"""The LoRA part of a linear layer: each adapter slot's low-rank factors over this rank's shard, and the delta
they add to the rows of the step that use that slot.

Per slot, one shrink and one expand: A [pieces * max_rank, in] and B [out, pieces * max_rank], zero-padded, where
a fused layer's pieces (q, k, v; gate, up) each own a block of the rank columns and B is zero outside its piece's
output rows and rank block, so one pair of matmuls serves them all and a target the adapter lacks adds nothing.
The scaling is folded into B. The weights are never merged into the base layer.

Batch invariance: a row's delta is its own: on the CPU the factors go into the fixed-order panels of
cpu_gemm_f32.c (a row's sum order does not depend on the row count), and the delta is added to the row alone.

Tensor parallelism: a column-parallel layer keeps A whole and its own output rows of B (qkv: this rank's heads
of each of q, k and v; gate/up: its rows of each). A row-parallel layer keeps its input columns of A; the [T, r]
shrink is all-reduced and the whole B applied once, after the base all-reduce, identically on every rank.
"""

import torch
import torch.nn.functional as F

from engine_core.distributed.parallel_state import all_reduce, tp_size
from engine_core.layers import cpu_gemm_f32
from engine_core.lora.peft_adapter import PeftAdapter
from engine_core.platform.batch_invariance import batch_invariant


class SlotFactors:
    """One slot's (A, B) of one layer, with the matmul that applies each."""

    def __init__(self, a: torch.Tensor, b: torch.Tensor):
        self.a, self.b = a, b
        fixed_order = (a.is_cpu and batch_invariant() and cpu_gemm_f32.can_pack(a))
        self.a_packed = cpu_gemm_f32.GenericPanelWeight(a) if fixed_order else None
        self.b_packed = cpu_gemm_f32.GenericPanelWeight(b) if fixed_order else None

    def shrink(self, x: torch.Tensor) -> torch.Tensor:
        return self.a_packed.matmul(x) if self.a_packed is not None else F.linear(x, self.a)

    def expand(self, t: torch.Tensor) -> torch.Tensor:
        return self.b_packed.matmul(t) if self.b_packed is not None else F.linear(t, self.b)


class LoRALayer:
    """The slots of one LoRA-able linear layer. `pieces` maps each PEFT module name the layer serves to where
    its output rows go: (offset in this rank's output, start in the module's whole output, count) for column
    layers; row layers have one piece and slice A by `in_slice` instead."""

    def __init__(self, layer_index: int, pieces: dict[str, tuple[int, int, int]], in_features: int,
                 out_features: int, max_loras: int, max_rank: int, in_slice: tuple[int, int] | None,
                 device: torch.device, dtype: torch.dtype):
        self.layer_index = layer_index
        self.pieces = pieces
        self.in_slice = in_slice  # (start, count) of A's columns on this rank: row-parallel layers
        self.reduce_shrink = in_slice is not None and tp_size() > 1
        self.max_rank = max_rank
        rank_cols = len(pieces) * max_rank
        self.a_stack = torch.zeros(max_loras, rank_cols, in_features, dtype=dtype, device=device)
        self.b_stack = torch.zeros(max_loras, out_features, rank_cols, dtype=dtype, device=device)
        self.slots: list[SlotFactors | None] = [None] * max_loras  # None: the slot's adapter leaves this layer be

    def load(self, slot: int, adapter: PeftAdapter) -> None:
        a, b = self.a_stack[slot], self.b_stack[slot]
        a.zero_()
        b.zero_()
        used = False
        for j, (module, (offset, start, count)) in enumerate(self.pieces.items()):
            weights = adapter.modules.get((self.layer_index, module))
            if weights is None:
                continue
            used = True
            cols = slice(j * self.max_rank, j * self.max_rank + weights.rank)
            wa = weights.a
            if self.in_slice is not None:
                wa = wa.narrow(1, *self.in_slice)
            a[cols].copy_(wa)
            b[offset:offset + count, cols].copy_(weights.b.narrow(0, start, count))
        self.slots[slot] = SlotFactors(a, b) if used else None

    def clear(self, slot: int) -> None:
        self.slots[slot] = None

    def add_delta(self, x: torch.Tensor, y: torch.Tensor, groups) -> torch.Tensor:
        """y plus, for each (slot, rows) group of the step, the rows' low-rank delta. Every rank runs the same
        groups (the all-reduce of a row-parallel shrink is a collective)."""
        for slot, rows in groups:
            factors = self.slots[slot]
            if factors is None:  # every rank holds the same adapter here, so none of them reduces
                continue
            xg = x if rows is None else x.index_select(0, rows)
            t = factors.shrink(xg)
            if self.reduce_shrink:
                t = all_reduce(t)
            delta = factors.expand(t)
            if rows is None:
                y = y + delta
            else:
                y = y.index_add(0, rows, delta)
        return y
