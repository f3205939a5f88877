"""What every attention backend needs to read and write the paged KV cache for one mixed batch.

The batch is flat: the new tokens of all sequences one after another (decodes first, then prefill
chunks). Sequence i owns query rows query_start_loc[i]:query_start_loc[i+1]; its keys are its
seq_lens[i] cached tokens, found through block_tables[i] (the last query_len of them are new).
"""

from dataclasses import dataclass

import torch


class AttentionPlan:
    """Base of a backend's per-step plan: what it derives from one step's metadata (gather indices,
    masks, cumulative lengths) and shares across layers. Each backend subclasses it with typed fields.

    Invariant: a plan describes exactly one AttentionMetadata and lives in its `plan` field; it is
    built on the first layer's call (or lazily, part by part) and only read after that."""


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] int64: cache slot (block_id * block_size + offset) per new token
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32: cumulative query lengths
    seq_lens: torch.Tensor  # [num_seqs] int32: cached tokens after this step (prefix + new)
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32, padded with 0
    max_query_len: int
    max_seq_len: int
    num_decodes: int  # the first num_decodes sequences have exactly one new token
    query_start_loc_cpu: list[int]
    seq_lens_cpu: list[int]
    # the serving backend's plan for this step, built on first use (see AttentionPlan); None until then
    plan: AttentionPlan | None = None

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_cpu)
