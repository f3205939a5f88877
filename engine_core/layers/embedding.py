"""Vocabulary-parallel embedding and LM head: each rank holds a contiguous slice of the vocabulary."""

import torch
import torch.nn.functional as F
from torch import nn

from engine_core.distributed.parallel_state import all_reduce, gather_to_rank0, tp_rank, tp_size
from engine_core.layers import cpu_packing


class VocabParallelEmbedding(nn.Module):
    # set by cpu_packing.pack_model where the weight is kept quantized: rows are dequantized as looked up
    quantized_rows = None

    def __init__(self, vocab_size: int, hidden_size: int):
        super().__init__()
        self.vocab_size = vocab_size
        self.per_rank = (vocab_size + tp_size() - 1) // tp_size()
        self.start = tp_rank() * self.per_rank
        self.end = min(self.start + self.per_rank, vocab_size)
        # empty, not zeros: a weight kept quantized is never loaded, and its pages are never touched (a 150k-token
        # vocabulary is hundreds of MB); the last rank's padding rows past the vocabulary are zeroed
        self.weight = nn.Parameter(torch.empty(self.per_rank, hidden_size), requires_grad=False)
        self.weight.data[self.end - self.start:].zero_()
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        part = loaded[self.start:self.end]
        param.data[: part.shape[0]].copy_(part)

    def _rows(self, ids: torch.Tensor) -> torch.Tensor:
        if self.quantized_rows is not None:
            return self.quantized_rows.rows_of(ids, self.weight.dtype).view(*ids.shape, -1)
        return F.embedding(ids, self.weight)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if tp_size() == 1:
            return self._rows(input_ids)
        mine = (input_ids >= self.start) & (input_ids < self.end)
        local = torch.where(mine, input_ids - self.start, 0)
        y = self._rows(local)
        y = y * mine.unsqueeze(-1).to(y.dtype)
        return all_reduce(y)


class ParallelLMHead(cpu_packing.PackableWeight, VocabParallelEmbedding):
    keeps_weight = True  # a tied head shares its weight with the embedding, which still reads it (the model
    # sets False for an untied head: its float copy goes once packed)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """Full-vocabulary logits on rank 0 (None on other ranks)."""
        logits = self.matmul(hidden)
        logits = gather_to_rank0(logits, dim=-1)
        return logits[..., : self.vocab_size] if logits is not None else None
