"""The torch backend's per-step plan: which cache slots its SDPA path gathers, and with which masks.

Decodes share one gather ([num_decodes, longest length], masked past each sequence's end); a prefill
chunk that follows cached blocks gets its own (its slots, a causal mask offset by the cached length).
Each part is built the first time a layer needs it and reused by every later layer of the step; parts
no layer needs (the C kernels served them, or nothing was cached) are never built.

A sliding-window layer (window w: the query at p sees keys p - w + 1 .. p) gets parts of its own, kept by
window: they gather only the keys some row of theirs sees, so blocks that fell out of every window (the
scheduler may have handed them to other requests) are never read.
"""

from dataclasses import dataclass, field

import torch

from engine_core.attention.metadata import AttentionMetadata, AttentionPlan


def token_slots(block_tables: torch.Tensor, block_size: int, length: int) -> torch.Tensor:
    """[B, length] cache slots of each sequence's first `length` tokens."""
    num_blocks = (length + block_size - 1) // block_size
    offsets = torch.arange(block_size, device=block_tables.device)
    slots = block_tables[:, :num_blocks, None].long() * block_size + offsets
    return slots.flatten(1)[:, :length]


@dataclass(frozen=True)
class KeyGather:
    slots: torch.Tensor  # int64 cache slots of the keys to gather: [B, L]
    mask: torch.Tensor  # additive mask in the activations' dtype, 0 or -inf, broadcastable to [B, 1, Q, L]


def position_slots(table: torch.Tensor, block_size: int, positions: torch.Tensor) -> torch.Tensor:
    """Cache slots of token positions [B, L] of the sequences whose block tables are table [B, blocks]."""
    blocks = table.long().gather(1, positions // block_size)
    return blocks * block_size + positions % block_size


def additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, float("-inf"))


@dataclass
class TorchPlan(AttentionPlan):
    decodes: KeyGather | None = None  # all decodes of the step, once some layer needed it
    prefills: dict[int, KeyGather] = field(default_factory=dict)  # by sequence index, chunks after cached blocks
    # sliding-window layers' parts: by window (decodes) and by (sequence index, window) (prefill chunks)
    windowed_decodes: dict[int, KeyGather] = field(default_factory=dict)
    windowed_prefills: dict[tuple[int, int], KeyGather] = field(default_factory=dict)

    @staticmethod
    def of(meta: AttentionMetadata) -> "TorchPlan":
        """The step's plan, created empty on first use."""
        if not isinstance(meta.plan, TorchPlan):
            meta.plan = TorchPlan()
        return meta.plan

    def decode_gather(self, meta: AttentionMetadata, block_size: int, dtype: torch.dtype) -> KeyGather:
        if self.decodes is None:
            nd = meta.num_decodes
            length = max(meta.seq_lens_cpu[:nd])
            slots = token_slots(meta.block_tables[:nd], block_size, length)
            valid = torch.arange(length, device=slots.device)[None, :] < meta.seq_lens[:nd, None]
            mask = torch.zeros(valid.shape, dtype=dtype, device=slots.device).masked_fill_(~valid, float("-inf"))
            self.decodes = KeyGather(slots, mask[:, None, None, :])
        return self.decodes

    def prefill_gather(self, meta: AttentionMetadata, i: int, q_len: int, block_size: int,
                       dtype: torch.dtype) -> KeyGather:
        """Sequence i's chunk of q_len new tokens after seq_lens[i] - q_len cached ones."""
        gather = self.prefills.get(i)
        if gather is None:
            seq_len, device = meta.seq_lens_cpu[i], meta.block_tables.device
            slots = token_slots(meta.block_tables[i: i + 1], block_size, seq_len)
            qpos = torch.arange(q_len, device=device)[:, None] + (seq_len - q_len)
            allowed = torch.arange(seq_len, device=device)[None, :] <= qpos
            mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, float("-inf"))
            gather = self.prefills[i] = KeyGather(slots, mask)
        return gather

    def windowed_decode_gather(self, meta: AttentionMetadata, block_size: int, dtype: torch.dtype,
                               window: int) -> KeyGather:
        """The decodes' last `window` keys each (fewer where a sequence is shorter), padded to the longest run
        with its own last key and masked there."""
        gather = self.windowed_decodes.get(window)
        if gather is None:
            nd, device = meta.num_decodes, meta.block_tables.device
            lens = meta.seq_lens[:nd].long()
            first = (lens - window).clamp(min=0)
            span = min(window, max(meta.seq_lens_cpu[:nd]))
            positions = first[:, None] + torch.arange(span, device=device)[None, :]
            valid = positions < lens[:, None]
            positions = torch.minimum(positions, lens[:, None] - 1)
            slots = position_slots(meta.block_tables[:nd], block_size, positions)
            gather = self.windowed_decodes[window] = KeyGather(slots, additive(valid, dtype)[:, None, None, :])
        return gather

    def windowed_prefill_gather(self, meta: AttentionMetadata, i: int, q_len: int, block_size: int,
                                dtype: torch.dtype, window: int) -> KeyGather:
        """Sequence i's chunk: the keys from its first row's window on, each row masked to its own window."""
        gather = self.windowed_prefills.get((i, window))
        if gather is None:
            seq_len, device = meta.seq_lens_cpu[i], meta.block_tables.device
            first = max(0, seq_len - q_len - window + 1)
            keys = torch.arange(first, seq_len, device=device)
            slots = position_slots(meta.block_tables[i: i + 1], block_size, keys[None, :])
            qpos = torch.arange(q_len, device=device)[:, None] + (seq_len - q_len)
            allowed = (keys[None, :] <= qpos) & (keys[None, :] > qpos - window)
            gather = self.windowed_prefills[(i, window)] = KeyGather(slots, additive(allowed, dtype))
        return gather
