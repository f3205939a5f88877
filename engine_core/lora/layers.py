"""The LoRA part of a linear layer: the low-rank factors of every adapter slot over this rank's shard, and the
delta they add to the rows of a step that use an adapter.

Per slot, A [pieces * max_rank, in] and B [out, pieces * max_rank], zero-padded: a fused layer's pieces (q, k,
v; gate, up) each own a block of the rank columns, and B is zero outside its piece's output rows and rank block,
so a target the adapter lacks adds nothing. The scaling is folded into B. The base weights are never touched.

One step, any mix of adapters, two matmuls: the slots' A stacked [slots * r, in] shrink every adapter row
against every slot; each row keeps only its own slot's columns (the others are set to zero), and the slots' B
side by side [out, slots * r] expand that. A row's sum then holds its own adapter's products in order with
exact zeros between them, so its bits do not depend on which slot holds its adapter or what the other slots
hold. On the CPU both matmuls run in dense_fixed_order.c's fixed-order panels (a row's sum order does not depend on
the row count), so a row's delta is the same alone or in any batch (batch invariance). Rows without an adapter
get nothing added, not even a zero.

Tensor parallelism: a column-parallel layer keeps A whole and its own output rows of B (qkv: this rank's heads
of each of q, k and v; gate/up: its rows of each). A row-parallel layer keeps its input columns of A; the
shrink is all-reduced and the whole B applied once, after the base all-reduce, identically on every rank.
"""

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from engine_core.distributed.parallel_state import all_reduce, tp_size
from engine_core.cpu_kernels.linear import dense_linear
from engine_core.lora.peft_adapter import PeftAdapter
from engine_core.platform.batch_invariance import batch_invariant


@dataclass
class LoRAStep:
    """Which rows of a step use which slot: `rows` the adapter rows (None: every row), `row_slots` the slot of
    each of them, `slots` those in use."""
    rows: torch.Tensor | None
    row_slots: torch.Tensor
    slots: frozenset
    _masks: dict = field(default_factory=dict)

    def keep_mask(self, slot_width: int, num_slots: int) -> torch.Tensor:
        """[adapter rows, num_slots * slot_width]: True in the columns of each row's own slot."""
        mask = self._masks.get(slot_width)
        if mask is None:
            col_slots = torch.arange(num_slots * slot_width, device=self.row_slots.device) // slot_width
            mask = self._masks[slot_width] = col_slots.unsqueeze(0) == self.row_slots.unsqueeze(1)
        return mask


class Factors:
    """A weight and the matmul that applies it: fixed-order panels on the CPU, F.linear elsewhere."""

    def __init__(self, weight: torch.Tensor):
        self.weight = weight
        fixed_order = weight.is_cpu and batch_invariant() and dense_linear.can_pack_fixed_order(weight)
        self.packed = dense_linear.GenericPanelWeight(weight) if fixed_order else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.packed.matmul(x) if self.packed is not None else F.linear(x, self.weight)


class LoRALayer:
    """The slots of one LoRA-able linear layer. `pieces` maps each PEFT module name the layer serves to where
    its output rows go: (offset in this rank's output, start in the module's whole output, count). Row-parallel
    layers slice A's columns by `in_slice` (start, count)."""

    def __init__(self, layer_index: int, pieces: dict[str, tuple[int, int, int]], in_features: int,
                 out_features: int, max_loras: int, max_rank: int, in_slice: tuple[int, int] | None,
                 device: torch.device, dtype: torch.dtype):
        self.layer_index = layer_index
        self.pieces = pieces
        self.in_slice = in_slice
        self.reduce_shrink = in_slice is not None and tp_size() > 1
        self.max_rank = max_rank
        self.num_slots = max_loras
        self.slot_width = len(pieces) * max_rank
        self.a_stack = torch.zeros(max_loras, self.slot_width, in_features, dtype=dtype, device=device)
        self.b_stack = torch.zeros(max_loras, out_features, self.slot_width, dtype=dtype, device=device)
        self.used_slots: set[int] = set()  # slots whose adapter has factors in this layer
        self.shrink: Factors | None = None
        self.expand: Factors | None = None

    def load(self, slot: int, adapter: PeftAdapter) -> None:
        a, b = self.a_stack[slot], self.b_stack[slot]
        a.zero_()
        b.zero_()
        self.used_slots.discard(slot)
        for j, (module, (offset, start, count)) in enumerate(self.pieces.items()):
            weights = adapter.modules.get((self.layer_index, module))
            if weights is None:
                continue
            self.used_slots.add(slot)
            cols = slice(j * self.max_rank, j * self.max_rank + weights.rank)
            wa = weights.a if self.in_slice is None else weights.a.narrow(1, *self.in_slice)
            a[cols].copy_(wa)
            b[offset:offset + count, cols].copy_(weights.b.narrow(0, start, count))
        self._pack()

    def _pack(self) -> None:
        if not self.used_slots:
            self.shrink = self.expand = None
            return
        out_features = self.b_stack.shape[1]
        self.shrink = Factors(self.a_stack.reshape(-1, self.a_stack.shape[2]))
        self.expand = Factors(self.b_stack.permute(1, 0, 2).reshape(out_features, -1).contiguous())

    def add_delta(self, x: torch.Tensor, y: torch.Tensor, step: LoRAStep) -> torch.Tensor:
        """y with each adapter row's delta added. Every tensor-parallel rank runs the same steps (the all-reduce
        of a row-parallel shrink is a collective), since their slots hold the same adapters."""
        if self.shrink is None or not (step.slots & self.used_slots):
            return y
        xa = x if step.rows is None else x.index_select(0, step.rows)
        t = self.shrink(xa)
        if self.reduce_shrink:
            t = all_reduce(t)
        t = torch.where(step.keep_mask(self.slot_width, self.num_slots), t, torch.zeros((), dtype=t.dtype,
                                                                                         device=t.device))
        delta = self.expand(t)
        return y + delta if step.rows is None else y.index_add(0, step.rows, delta)
