"""CUDA graphs for decode-only steps.

A decode step launches a few hundred small kernels for very little work each; replaying a captured
graph launches them all at once. Graphs have fixed shapes and fixed addresses, so:

* One graph per batch size in `graph_batch_sizes` (1, 2, 4, 8, then every 8 up to max_num_seqs).
  A step of n decodes replays the smallest graph of at least n rows; rows n.. are padding.
* Every input lives in a static buffer the graphs were captured on: token ids, positions, slot
  mapping, sequence lengths, block tables (as wide as max_model_len needs), and the output hidden
  states. A step copies its inputs in (one pinned host tensor, no host sync) and replays.
* Padding rows write nothing (slot -1: the store kernels skip it) and attend over one key of
  whatever block their stale table row names (seq_len 1), so they read valid memory and cannot
  disturb the real rows; their outputs are never read.
* Capture runs after the KV cache is allocated, largest batch first, all graphs sharing one memory
  pool (a smaller graph's intermediates fit in what the largest one took). Each batch size is run
  once eagerly first, so kernels are compiled and workspaces allocated outside the capture.

Graphs need an attention backend that reads every per-step value on the device: the model runner
captures only with one whose capabilities say `cuda_graphs` (triton, flash_attn); the torch backend
sizes its decode gathers from host-side lengths, so it stays eager.
Only the model forward is captured; the LM head and the sampler run eagerly on the real rows.
"""

import bisect
import logging
import time
from typing import NamedTuple

import torch

from engine_core.attention.backend import AttentionBackend
from engine_core.attention.metadata import AttentionMetadata
from engine_core.layers.forward_context import forward_context
from engine_core.worker.step_input import StepInput

logger = logging.getLogger("nvllm")

MAX_GRAPH_BATCH = 512  # larger decode batches run eagerly: the launch overhead no longer dominates


def graph_batch_sizes(max_num_seqs: int, limit: int = MAX_GRAPH_BATCH) -> list[int]:
    """The batch sizes to capture: 1, 2, 4, 8, 16, 24, ... up to min(max_num_seqs, limit), which is
    always the last."""
    top = max(1, min(max_num_seqs, limit))
    sizes = [s for s in (1, 2, 4, 8) if s <= top] + list(range(16, top + 1, 8))
    if sizes[-1] != top:
        sizes.append(top)
    return sizes


def pick_batch_size(sizes: list[int], n: int) -> int | None:
    """The smallest captured size that holds n rows; None if none does."""
    i = bisect.bisect_left(sizes, n)
    return sizes[i] if i < len(sizes) else None


def is_decode_only(step: StepInput) -> bool:
    n = len(step.seq_lens)
    return n > 0 and step.num_decodes == n and len(step.input_ids) == n


class PaddedDecodeInputs(NamedTuple):
    rows: torch.Tensor  # [4, batch] int64: input ids, positions, slot mapping, seq lens
    block_tables: torch.Tensor  # [n, widest table] int32 (only the real rows)


def pad_decode_inputs(step: StepInput, batch_size: int) -> PaddedDecodeInputs:
    """A decode-only step's inputs on the host, padded to batch_size rows: padding tokens are id 0 at
    position 0 with slot -1 (nothing stored) and seq_len 1. Block tables cover the real rows only; the
    padding rows keep whatever table rows the buffer holds (any valid block id will do)."""
    n = len(step.input_ids)
    pad = batch_size - n
    assert pad >= 0, f"{n} decodes do not fit a batch of {batch_size}"
    rows = torch.tensor([step.input_ids + [0] * pad, step.positions + [0] * pad,
                         step.slot_mapping + [-1] * pad, step.seq_lens + [1] * pad], dtype=torch.int64)
    width = max(map(len, step.block_tables))
    tables = torch.tensor([t + [0] * (width - len(t)) for t in step.block_tables], dtype=torch.int32)
    return PaddedDecodeInputs(rows, tables)


class DecodeGraphRunner:
    """Captures the model's forward for decode batches and replays it; see the module docstring."""

    def __init__(self, model: torch.nn.Module, backend: AttentionBackend, hidden_size: int, dtype: torch.dtype,
                 device: torch.device, max_num_seqs: int, max_blocks_per_seq: int, block_size: int):
        self.model = model
        self.backend = backend
        self.device = device
        self.sizes = graph_batch_sizes(max_num_seqs)
        top = self.sizes[-1]
        self.max_seq_len = max_blocks_per_seq * block_size
        with torch.device(device):
            # rows of `inputs`: token ids, positions, slot mapping, seq lens (int64, as the step copies them)
            self.inputs = torch.zeros(4, top, dtype=torch.int64)
            self.inputs[2].fill_(-1)
            self.inputs[3].fill_(1)
            self.seq_lens = torch.ones(top, dtype=torch.int32)  # the kernels read int32 lengths
            self.query_start_loc = torch.arange(top + 1, dtype=torch.int32)  # one query token per row
            self.block_tables = torch.zeros(top, max_blocks_per_seq, dtype=torch.int32)
            self.hidden = torch.zeros(top, hidden_size, dtype=dtype)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}

    def _meta(self, b: int) -> AttentionMetadata:
        # the host-side lists are placeholders: graph-capable backends read the device tensors only
        return AttentionMetadata(
            slot_mapping=self.inputs[2, :b], query_start_loc=self.query_start_loc[: b + 1],
            seq_lens=self.seq_lens[:b], block_tables=self.block_tables[:b], max_query_len=1,
            max_seq_len=self.max_seq_len, num_decodes=b, query_start_loc_cpu=list(range(b + 1)),
            seq_lens_cpu=[1] * b)

    def _forward(self, b: int) -> None:
        with forward_context(self._meta(b), self.backend):
            self.hidden[:b] = self.model(self.inputs[0, :b], self.inputs[1, :b])

    @torch.inference_mode()
    def capture(self) -> None:
        torch.cuda.synchronize(self.device)
        start = time.perf_counter()
        free_before = torch.cuda.mem_get_info(self.device)[0]
        pool = None
        for b in reversed(self.sizes):
            self._forward(b)  # warm-up: compile kernels, allocate workspaces outside the capture
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self._forward(b)
            if pool is None:
                pool = graph.pool()
            self.graphs[b] = graph
        torch.cuda.synchronize(self.device)
        taken = free_before - torch.cuda.mem_get_info(self.device)[0]
        logger.info("CUDA graphs: captured %d decode batch sizes (1 .. %d) in %.1f s, using %.2f GiB",
                    len(self.sizes), self.sizes[-1], time.perf_counter() - start, taken / 2**30)

    def can_run(self, step: StepInput) -> bool:
        return (bool(self.graphs) and is_decode_only(step) and len(step.input_ids) <= self.sizes[-1]
                and max(map(len, step.block_tables)) <= self.block_tables.shape[1])

    @torch.inference_mode()
    def run(self, step: StepInput) -> torch.Tensor:
        """Hidden states [num decodes, hidden] of a step that can_run; valid until the next run."""
        n = len(step.input_ids)
        b = pick_batch_size(self.sizes, n)
        rows, tables = pad_decode_inputs(step, b)
        if self.device.type == "cuda":
            # pinned, so the copies are asynchronous; the pinned allocator keeps each buffer until its copy is done
            rows, tables = rows.pin_memory(), tables.pin_memory()
        self.inputs[:, :b].copy_(rows, non_blocking=True)
        self.seq_lens[:b].copy_(self.inputs[3, :b])
        self.block_tables[:n, : tables.shape[1]].copy_(tables, non_blocking=True)
        self.graphs[b].replay()
        return self.hidden[:n]
