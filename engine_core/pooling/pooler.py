"""Rank 0 of a pooling engine: turns each embedding request's prompt hidden states into its vector.

The hidden states are the model's final, normed ones (what transformers' AutoModel calls last_hidden_state).
A prompt may be computed in several chunks (the step's token budget), so the pooler keeps what it needs between
them, by request id: CLS its first row, MEAN a running sum. The sum adds the rows one by one in prompt order,
in float64, carried from chunk to chunk (a cumulative sum, sequential on the CPU), so the vector does not depend
on how the prompt was chunked. A chunk that starts at position 0 starts afresh (a preempted request recomputes
its prompt). MEAN and CLS requests never take prefix-cache hits (Request.pools_every_position); LAST needs only
the last position, which is always computed.
"""

import numpy as np
import torch

from common.pooling_params import PoolerConfig, PoolingParams


class Pooler:
    def __init__(self, config: PoolerConfig):
        self.pooling_type = config.pooling_type
        self.normalize = config.normalize
        self.partial: dict[str, torch.Tensor] = {}  # request id -> CLS's first row, MEAN's running sum

    def add_chunk(self, request_id: str, params: PoolingParams, start: int, num_prompt_tokens: int,
                  rows: torch.Tensor) -> bytes | None:
        """rows: the hidden states [n, hidden] of prompt positions start..start+n-1. The request's vector (float32
        little-endian bytes) once the chunk completes its prompt, else None."""
        end = start + rows.shape[0]
        if self.pooling_type == "CLS" and start == 0:
            self.partial[request_id] = rows[0].double()
        elif self.pooling_type == "MEAN":
            carry = self.partial.get(request_id) if start > 0 else None
            rows = rows.double()
            if carry is not None:
                rows = torch.cat([carry[None], rows])
            self.partial[request_id] = rows.cumsum(0)[-1]
        if end < num_prompt_tokens:
            return None
        if self.pooling_type == "LAST":
            vector = rows[-1].double()
        else:
            vector = self.partial.pop(request_id)
            if self.pooling_type == "MEAN":
                vector = vector / num_prompt_tokens
        return self._finish(vector, params)

    def _finish(self, vector: torch.Tensor, params: PoolingParams) -> bytes:
        """Matryoshka truncation, then L2 normalisation (so a truncated vector is renormalised)."""
        if params.dimensions is not None:
            vector = vector[:params.dimensions]
        normalize = self.normalize if params.normalize is None else params.normalize
        if normalize:
            vector = torch.nn.functional.normalize(vector, p=2.0, dim=0)
        return np.ascontiguousarray(vector.float().cpu().numpy(), dtype="<f4").tobytes()

    def forget(self, request_id: str) -> None:
        self.partial.pop(request_id, None)
