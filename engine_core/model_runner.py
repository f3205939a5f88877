"""Runs the model for one scheduled step: flat inputs for the mixed batch, forward, sample.

One ModelRunner per tensor-parallel rank. Rank 0 also samples; the others only run the forward.
"""

import logging
import time

import torch

from common.config import EngineArgs, parse_size
from engine_core.attention.metadata import AttentionMetadata
from engine_core.attention.selector import get_attention_backend
from engine_core.distributed.parallel_state import tp_rank
from engine_core.forward_context import forward_context
from engine_core.layers.attention import PagedAttention
from engine_core.models.registry import model_class
from engine_core.sampler import Sampler
from engine_core.step_input import StepInput
from engine_core.weights.loader import load_safetensors_weights

logger = logging.getLogger("nvllm")

DEFAULT_CPU_KV_CACHE_BYTES = 1 << 30


class ModelRunner:
    def __init__(self, args: EngineArgs, model_path: str, hf_config, device: torch.device, dtype: torch.dtype):
        self.args = args
        self.device = device
        self.dtype = dtype
        self.block_size = args.block_size
        start = time.perf_counter()
        previous = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            with torch.device(device):
                self.model = model_class(hf_config.architectures)(hf_config)
        finally:
            torch.set_default_dtype(previous)
        self.model.load_weights(load_safetensors_weights(model_path))
        self.model.eval()
        self.attn_layers = [m for m in self.model.modules() if isinstance(m, PagedAttention)]
        self.backend = get_attention_backend(args.attention_backend, device)
        self.sampler = Sampler(device, args.seed) if tp_rank() == 0 else None
        if tp_rank() == 0:
            logger.info("loaded %s (%s) on %s in %.1f s, attention backend %s",
                        hf_config.architectures[0], str(dtype).removeprefix("torch."), device,
                        time.perf_counter() - start, self.backend.name)

    # ---- KV cache ---------------------------------------------------------------------------

    def kv_bytes_per_block(self) -> int:
        layer = self.attn_layers[0]
        elem = torch.tensor([], dtype=self.dtype).element_size()
        return 2 * len(self.attn_layers) * self.block_size * layer.num_kv_heads * layer.head_dim * elem

    def kv_cache_budget(self) -> int:
        """Bytes this rank may give the KV cache."""
        if self.args.kv_cache_memory is not None:
            return parse_size(self.args.kv_cache_memory)
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            used_by_others = total - free
            return int(total * self.args.gpu_memory_utilization - used_by_others)
        return DEFAULT_CPU_KV_CACHE_BYTES

    def allocate_kv_cache(self, num_blocks: int) -> None:
        layer = self.attn_layers[0]
        shape = (num_blocks, self.block_size, layer.num_kv_heads, layer.head_dim)
        for attn in self.attn_layers:
            attn.k_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
            attn.v_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)

    # ---- one step ---------------------------------------------------------------------------

    def _metadata(self, step: StepInput) -> AttentionMetadata:
        dev = self.device
        tables = torch.zeros(len(step.block_tables), max(map(len, step.block_tables)), dtype=torch.int32)
        for i, table in enumerate(step.block_tables):
            tables[i, : len(table)] = torch.tensor(table, dtype=torch.int32)
        return AttentionMetadata(
            slot_mapping=torch.tensor(step.slot_mapping, dtype=torch.int64, device=dev),
            query_start_loc=torch.tensor(step.query_start_loc, dtype=torch.int32, device=dev),
            seq_lens=torch.tensor(step.seq_lens, dtype=torch.int32, device=dev),
            block_tables=tables.to(dev),
            max_query_len=max(b - a for a, b in zip(step.query_start_loc, step.query_start_loc[1:])),
            max_seq_len=max(step.seq_lens),
            num_decodes=step.num_decodes,
            query_start_loc_cpu=step.query_start_loc,
            seq_lens_cpu=step.seq_lens,
        )

    @torch.inference_mode()
    def forward(self, step: StepInput) -> torch.Tensor | None:
        """Logits [num sampled sequences, vocab] on rank 0; None on other ranks."""
        meta = self._metadata(step)
        input_ids = torch.tensor(step.input_ids, dtype=torch.int64, device=self.device)
        positions = torch.tensor(step.positions, dtype=torch.int64, device=self.device)
        with forward_context(meta, self.backend):
            hidden = self.model(input_ids, positions)
        sample_rows = torch.tensor(step.sample_rows, dtype=torch.int64, device=self.device)
        return self.model.compute_logits(hidden[sample_rows])
