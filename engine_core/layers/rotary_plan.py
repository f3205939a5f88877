"""The rotary cos/sin rows of one step, looked up once and shared by every layer.

Every layer rotates the same token positions with the same table (one per model, see rotary.py), so
the first layer's lookup serves the rest. The tables are kept by what they depend on besides the
step's positions: the table they come from and the activations' dtype.

Invariant: a RotaryPlan lives for one forward pass (ForwardContext), so one set of positions.
"""

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class RotaryTables:
    cos: torch.Tensor  # [T, 1, D] in the activations' dtype: broadcast over heads
    sin: torch.Tensor


@dataclass
class RotaryPlan:
    _tables: dict[tuple[int, torch.dtype], RotaryTables] = field(default_factory=dict)

    def tables(self, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype) -> RotaryTables:
        """cos/sin [max_position, D] float32 tables' rows at positions, in dtype (as transformers rounds
        them, so bfloat16 runs match it too)."""
        key = (id(cos), dtype)
        tables = self._tables.get(key)
        if tables is None:
            tables = self._tables[key] = lookup(cos, sin, positions, dtype)
        return tables


def lookup(cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype) -> RotaryTables:
    return RotaryTables(cos[positions].unsqueeze(1).to(dtype), sin[positions].unsqueeze(1).to(dtype))
