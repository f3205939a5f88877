"""Runs the model for one scheduled step: flat inputs for the mixed batch, forward, sample.

One ModelRunner per tensor-parallel rank. Rank 0 also samples; the others only run the forward.
On CUDA, the KV cache gets what `gpu_memory_utilization` leaves after a profiling step at the
largest batch (`profile_run`), and decode-only steps replay CUDA graphs (engine_core/worker/cuda_graph.py)
unless `enforce_eager` is set.
"""

import logging
import time

import torch

from common.wire_messages import Logprobs
from common.sampling_params import SamplingParams
from engine_core.platform import batch_invariance
from engine_core.cpu_kernels.attention import paged_avx512_bf16
from engine_core.attention.capabilities import AttentionSetup
from engine_core.attention.metadata import AttentionMetadata
from engine_core.attention.selector import select_attention_backend
from engine_core.cpu_kernels import table as cpu_kernel_table
from engine_core.worker.cuda_graph import DecodeGraphRunner
from engine_core.distributed.parallel_state import tp_rank, tp_size
from engine_core.engine_config import EngineConfig
from engine_core.families.spec import for_context
from engine_core.layers.forward_context import forward_context
from engine_core.layers import cpu_packing
from engine_core.cpu_kernels.ops import fused_ops
from engine_core.layers.attention import PagedAttention
from engine_core.lora.manager import LoRAManager
from engine_core.cpu_kernels.decoder.loop_avx512_bf16 import CpuDecoder
from engine_core.cpu_kernels.decoder.loop_portable import CpuDecoderBF16Generic, CpuDecoderF32
from engine_core.models.registry import model_class
from engine_core.pooling.pooler import Pooler
from engine_core.sched.request import Request
from engine_core.sample.sampler import Sampler, logprobs_of
from engine_core.sample import rejection
from engine_core.worker.step_input import PlannedStep, StepBuilder, StepInput, StepResult
from engine_core.weights import quantized
from engine_core.weights.loader import load_safetensors_weights

logger = logging.getLogger("nvllm")

DEFAULT_CPU_KV_CACHE_BYTES = 1 << 30


class ModelRunner:
    def __init__(self, config: EngineConfig, role: str = "model"):
        self.config = config
        self.device = device = this_rank_device(config.device)
        self.dtype = dtype = config.torch_dtype()
        self.block_size = config.block_size
        self.max_model_len = config.max_model_len
        spec = for_context(config.model.spec, config.max_model_len)
        self.hidden_size = spec.hidden_size
        self.graph_runner: DecodeGraphRunner | None = None
        self.activation_peak: int | None = None  # bytes, once profile_run has measured it
        batch_invariance.set_batch_invariant(config.batch_invariant)  # before packing: it picks kernels
        if device.type == "cpu":
            cpu_kernel_table.prebuild()  # a fresh machine compiles the tier's kernels side by side, once
        start = time.perf_counter()
        previous = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            with torch.device(device):
                self.model = model_class(spec)(spec)
        finally:
            torch.set_default_dtype(previous)
        # LoRA slots before packing: a gate/up layer with adapters keeps its projection unfused (lora/layers.py)
        self.lora = (LoRAManager(self.model, spec, config.lora, device, dtype) if config.lora is not None else None)
        # layers kept quantized get their GGUF blocks first, so their float copies are never read nor made
        self.quantization, as_blocks = quantized.keep_gguf_blocks(self.model, config.model.path, config.quantization,
                                                                  device, dtype)
        # an embedding engine never runs the LM head: a folder saved without one (Qwen3-Embedding's) loads too
        self.model.load_weights(load_safetensors_weights(config.model.path, skip=as_blocks),
                                head_optional=config.runner == "pooling")
        self.model.eval()
        if config.quantization == "int8":
            self.quantization = quantized.quantize_int8(self.model, config.quantization, device, dtype)
        if config.runner == "pooling":  # an embedding engine never runs the LM head: neither pack nor keep it
            self.model.lm_head = None
        dense = cpu_packing.can_pack(device, dtype)
        if dense or self.quantization != "none":
            cpu_packing.pack_model(self.model, dense)
        if device.type == "cpu" and dtype == torch.bfloat16:
            paged_avx512_bf16.load()  # built (once per machine) now, not in the first request's decode step
            fused_ops.load()  # likewise the fused norm / SiLU-and-mul / rotary kernels
        self.attn_layers = [m for m in self.model.modules() if isinstance(m, PagedAttention)]
        self.backend = self._attention_backend()
        # the one-call C loop knows nothing of LoRA: with adapters on, every step runs the modules, so a base
        # request computes the same whether or not adapter rows share its step
        if self.lora is not None and tp_rank() == 0:
            logger.info("LoRA: %d adapter slot(s) of rank up to %d; decoder layers run as modules",
                        config.lora.max_loras, config.lora.max_lora_rank)
        if (self.lora is None and self.backend.capabilities.fused_cpu_decoder
                and hasattr(self.model, "cpu_decoder")):
            # bf16: loop_avx512_bf16.c's kernels where they run (avx512_bf16 and up), else, where the attention is the
            # generic kernel's as in the loop, the float32 loop's source built for bf16
            loops = ((CpuDecoderF32,) if dtype is torch.float32
                     else (CpuDecoder, CpuDecoderBF16Generic) if self.backend.name == "cpu_generic" else (CpuDecoder,))
            self.model.cpu_decoder = self._decoder_loop(loops)
        # prompt rows of kept-quantized layers computed with their own arithmetic (CpuDecoder.prompt_arithmetic)
        decoder = getattr(self.model, "cpu_decoder", None)
        self.prompt_arithmetic = decoder is not None and decoder.prompt_arithmetic
        if self.prompt_arithmetic and tp_rank() == 0:
            logger.info("kept-quantized layers: prompt tokens on AMX tiles with the dequantized model's weights, "
                        "output tokens by exact integer block sums (amx_quant.c); cached blocks that hold output "
                        "tokens are keyed by their prompt tokens")
        self.sampler = Sampler(device, config.seed) if tp_rank() == 0 else None
        self.pooler = Pooler(config.pooler) if config.pooler is not None and tp_rank() == 0 else None
        if tp_rank() == 0 and device.type == "cpu":
            logger.info("%s; linear layers: %s", cpu_kernel_table.describe(str(dtype).removeprefix("torch.")),
                        cpu_packing.kernels_used(self.model))
        if tp_rank() == 0:
            logger.info("loaded %s %s (%s) on %s in %.1f s, attention backend %s, weights kept quantized: %s "
                        "(%.0f MB of weights)", role, spec.architecture, str(dtype).removeprefix("torch."), device,
                        time.perf_counter() - start, self.backend.name, self.quantization, weight_bytes(self.model) / 1e6)

    def _decoder_loop(self, loops):
        """The first of the one-call C decoder loops `loops` that runs this model exactly as its modules would;
        None (and why, in the load log) if none does."""
        reasons = []
        for loop in loops:
            why = loop.why_not(self.model)
            if why is None:
                return loop(self.model)
            reasons.append(f"{loop.__name__}: {why}")
        if tp_rank() == 0:
            logger.info("decoder layers run as modules, not a one-call C loop: %s", "; ".join(reasons))
        return None

    def _attention_backend(self):
        layer = self.attn_layers[0]
        setup = AttentionSetup(self.device.type, self.dtype, self.block_size, layer.num_heads, layer.num_kv_heads,
                               layer.head_dim)
        backend = select_attention_backend(self.config.attention_backend, setup, warn=tp_rank() == 0)
        if (batch_invariance.batch_invariant() and self.device.type == "cpu" and tp_rank() == 0
                and not backend.capabilities.batch_invariant):
            logger.warning("attention backend %s is not batch-invariant: a request's last bits may depend on its batch",
                           backend.name)
        return backend

    # ---- KV cache ---------------------------------------------------------------------------

    def kv_bytes_per_block(self) -> int:
        layer = self.attn_layers[0]
        elem = torch.tensor([], dtype=self.dtype).element_size()
        return 2 * len(self.attn_layers) * self.block_size * layer.num_kv_heads * layer.head_dim * elem

    def kv_cache_budget(self) -> int:
        """Bytes this rank may give the KV cache."""
        if self.config.kv_cache_memory is not None:
            return self.config.kv_cache_memory
        if self.device.type == "cuda":
            # tensor-parallel ranks would have to profile in step (collectives); they have no profile yet
            peak = self.profile_run() if tp_size() == 1 else 0
            free, total = torch.cuda.mem_get_info(self.device)
            in_use = total - free  # weights, CUDA context, other processes
            budget = int(total * self.config.gpu_memory_utilization - in_use - peak)
            if tp_rank() == 0:
                logger.info("GPU memory: %.2f GiB total x %.2f utilization - %.2f GiB in use - %.2f GiB "
                            "peak of the profiled step = %.2f GiB for the KV cache", total / 2**30,
                            self.config.gpu_memory_utilization, in_use / 2**30, peak / 2**30, budget / 2**30)
            return budget
        return DEFAULT_CPU_KV_CACHE_BYTES

    @torch.inference_mode()
    def profile_run(self) -> int:
        """Runs the largest step the scheduler can make on dummy inputs (max_num_batched_tokens tokens:
        max_num_seqs sampled rows, the rest one long prefill chunk), sampler included, over a temporary
        KV cache just large enough. Returns the peak bytes the step allocated (CUDA; 0 on other devices)."""
        if self.activation_peak is not None:
            return self.activation_peak
        lens = profile_lengths(self.config.max_num_batched_tokens, self.config.max_num_seqs, self.max_model_len)
        step, num_blocks = dummy_step(lens, self.block_size, sample=self.config.runner != "pooling")
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
            base = torch.cuda.memory_allocated(self.device)
        saved = [(a.k_cache, a.v_cache) for a in self.attn_layers]
        self._bind_kv_cache(num_blocks)
        try:
            logits = self.forward(step)
            if logits is not None and self.sampler is not None:
                self._profile_sampler(logits)
            del logits
            if cuda:
                torch.cuda.synchronize(self.device)
                cache = num_blocks * self.kv_bytes_per_block()
                self.activation_peak = max(0, torch.cuda.max_memory_allocated(self.device) - base - cache)
            else:
                self.activation_peak = 0
        finally:
            for a, (k, v) in zip(self.attn_layers, saved):
                a.k_cache, a.v_cache = k, v
            if cuda:
                torch.cuda.empty_cache()
        if cuda and tp_rank() == 0:
            logger.info("profiled a step of %d tokens in %d sequences: peak %.2f GiB beyond the weights",
                        sum(lens), len(lens), self.activation_peak / 2**30)
        return self.activation_peak

    def _profile_sampler(self, logits: torch.Tensor) -> None:
        """The sampler's most memory-hungry path on every row; its random stream is left as it was."""
        params = SamplingParams(temperature=0.8, top_k=50, top_p=0.9, min_p=0.01, logprobs=20,
                                repetition_penalty=1.1, presence_penalty=0.1, frequency_penalty=0.1)
        reqs = [Request(f"profile-{i}", [0, 1], params) for i in range(logits.shape[0])]
        for r in reqs:
            r.append_output_token(2)  # so the frequency and presence penalties have work
        state = self.sampler.generator.get_state()
        try:
            self.sampler(logits, reqs)
        finally:
            self.sampler.generator.set_state(state)

    def allocate_kv_cache(self, num_blocks: int) -> None:
        self._bind_kv_cache(num_blocks)
        if self._use_cuda_graphs():
            self.graph_runner = DecodeGraphRunner(
                self.model, self.backend, self.hidden_size, self.dtype, self.device, self.config.max_num_seqs,
                -(-self.max_model_len // self.block_size), self.block_size)
            self.graph_runner.capture()

    def _bind_kv_cache(self, num_blocks: int) -> None:
        layer = self.attn_layers[0]
        shape = (num_blocks, self.block_size, layer.num_kv_heads, layer.head_dim)
        for attn in self.attn_layers:
            attn.k_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
            attn.v_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)

    def _use_cuda_graphs(self) -> bool:
        if self.device.type != "cuda" or self.config.enforce_eager:
            return False
        why = None
        if not self.backend.capabilities.cuda_graphs:
            why = f"the {self.backend.name} attention backend sizes decode steps on the host"
        elif tp_size() > 1:
            why = "tensor parallelism does not capture its collectives yet"
        elif self.lora is not None:
            why = "LoRA adapters pick their rows on the host"
        elif self.model.spec.num_experts:
            why = "the MoE layers count each expert's tokens on the host (layers/moe.py)"
        if why:
            if tp_rank() == 0:
                logger.info("CUDA graphs: off (%s); decode steps run eagerly", why)
            return False
        return True

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
        return self.forward_step(step)[0]

    @torch.inference_mode()
    def forward_step(self, step: StepInput) -> tuple[torch.Tensor | None, list[Logprobs], torch.Tensor]:
        """The sampled rows' logits and, for each of step.scored_rows, the logprob of its target token with
        step.scored_top_n top ids (rank 0; None and [] on other ranks, which only join the collectives); and the
        final hidden states of every row (what embedding requests pool). A step with no sampled rows (only
        embedding requests) skips the LM head, on every rank alike."""
        if step.block_copies:
            self.copy_blocks(step.block_copies)
        if self.graph_runner is not None and self.graph_runner.can_run(step):
            hidden = self.graph_runner.run(step)
            if step.sample_rows == list(range(len(step.input_ids))):
                return self.model.compute_logits(hidden), self._score_rows(hidden, step), hidden
            rows = torch.tensor(step.sample_rows, dtype=torch.int64)
            rows = (rows.pin_memory() if self.device.type == "cuda" else rows).to(self.device, non_blocking=True)
            return self._logits(hidden, rows), self._score_rows(hidden, step), hidden
        meta = self._metadata(step)
        input_ids = torch.tensor(step.input_ids, dtype=torch.int64, device=self.device)
        positions = torch.tensor(step.positions, dtype=torch.int64, device=self.device)
        rows = (self.lora.prepare(step.lora_requests, step.seq_loras, step.query_start_loc)
                if self.lora is not None else None)
        with forward_context(meta, self.backend, rows, step.prompt_runs if self.prompt_arithmetic else ()):
            hidden = self.model(input_ids, positions)
        sample_rows = torch.tensor(step.sample_rows, dtype=torch.int64, device=self.device)
        return self._logits(hidden, sample_rows), self._score_rows(hidden, step), hidden

    def _logits(self, hidden: torch.Tensor, rows: torch.Tensor) -> torch.Tensor | None:
        return self.model.compute_logits(hidden[rows]) if rows.numel() else None

    def copy_blocks(self, copies: list[list[int]]) -> None:
        """Copy whole KV blocks src -> dst in every layer (beams forked after the last step get their own copy of
        their parent's partial block); every rank runs the same copies on its own heads."""
        src = torch.tensor([c[0] for c in copies], dtype=torch.int64, device=self.device)
        dst = torch.tensor([c[1] for c in copies], dtype=torch.int64, device=self.device)
        for attn in self.attn_layers:
            attn.k_cache.index_copy_(0, dst, attn.k_cache.index_select(0, src))
            attn.v_cache.index_copy_(0, dst, attn.v_cache.index_select(0, src))

    def _score_rows(self, hidden: torch.Tensor, step: StepInput) -> list[Logprobs]:
        """Prompt logprobs: the head over the scored rows, a slice at a time so a long prompt chunk never holds
        all its [rows, vocab] logits at once. Each row's numbers are its own (the head's kernels do not depend
        on how many rows they get)."""
        if not step.scored_rows:
            return []
        rows = torch.tensor(step.scored_rows, dtype=torch.int64, device=self.device)
        targets = torch.tensor(step.scored_targets, dtype=torch.int64, device=self.device)
        scored = []
        for first in range(0, len(rows), SCORED_ROWS_PER_PASS):
            part = slice(first, first + SCORED_ROWS_PER_PASS)
            logits = self.model.compute_logits(hidden[rows[part]])
            if logits is None:
                continue
            logprobs = torch.log_softmax(logits.float(), dim=-1)
            scored += logprobs_of(targets[part], logprobs, [step.scored_top_n] * logits.shape[0])[1]
        return scored

    def sample(self, logits: torch.Tensor, reqs: list[Request],
               drafts: list[list[int]]) -> tuple[dict[str, list[int]], dict[str, list[Logprobs]]]:
        """Rank 0: each sampled request's new tokens (the proposals it keeps, then one more) and their
        logprobs where asked. A step without proposals samples one token per request."""
        if not reqs:
            return {}, {}
        if any(drafts):
            tokens, logprobs = rejection.verify(self.sampler, logits, reqs, drafts)
            return ({r.request_id: t for r, t in zip(reqs, tokens)},
                    {r.request_id: lp for r, lp in zip(reqs, logprobs) if lp})
        tokens, logprobs = self.sampler(logits, reqs)
        return ({r.request_id: [t] for r, t in zip(reqs, tokens)},
                {r.request_id: [lp] for r, lp in zip(reqs, logprobs) if lp is not None})

    def finish_step(self, planned: PlannedStep, logits: torch.Tensor | None, scored: list[Logprobs],
                    hidden: torch.Tensor | None = None) -> StepResult:
        """Rank 0, after forward_step: sample, hand each scored request its prompt logprobs (with as many top
        ids as it asked), and pool the embedding requests' rows (their vectors once their prompts are done)."""
        sampled, logprobs = self.sample(logits, planned.sampled, planned.drafts)
        prompt_logprobs, at = {}, 0
        for req, count in planned.scored:
            n = req.sampling_params.prompt_logprobs
            prompt_logprobs[req.request_id] = [with_top(lp, n) for lp in scored[at:at + count]]
            at += count
        embeddings = {}
        for req, start, first_row, num_rows in planned.pooled:
            if self.pooler is None:
                raise RuntimeError("an embedding request reached an engine that is not a pooling engine")
            vector = self.pooler.add_chunk(req.request_id, req.pooling_params, start, req.num_prompt_tokens,
                                           hidden[first_row:first_row + num_rows])
            if vector is not None:
                embeddings[req.request_id] = vector
        return StepResult(sampled, logprobs, prompt_logprobs, embeddings)


SCORED_ROWS_PER_PASS = 256


def with_top(logprobs: Logprobs, n: int) -> Logprobs:
    """logprobs with only its n most likely ids (a step computes as many as its most demanding request asks)."""
    if len(logprobs.top_token_ids) > n:
        logprobs.top_token_ids, logprobs.top_logprobs = logprobs.top_token_ids[:n], logprobs.top_logprobs[:n]
    return logprobs


def this_rank_device(device_type: str) -> torch.device:
    """This process's device: with tensor parallelism the CUDA device its rank selected
    (rendezvous.rank_device), else the device type itself."""
    if device_type == "cuda" and tp_size() > 1:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(device_type)


def weight_bytes(model) -> int:
    """Bytes the model's weights take in memory: parameters, packed copies and quantized blocks (a copy
    two modules share counted once)."""
    packed = {id(p): p.nbytes for m in model.modules()
              for p in (getattr(m, "packed_weight", None), getattr(m, "quantized_rows", None)) if p is not None}
    return sum(p.numel() * p.element_size() for p in model.parameters()) + sum(packed.values())


def profile_lengths(num_tokens: int, max_num_seqs: int, max_model_len: int) -> list[int]:
    """Sequence lengths of the profiling step: as many one-token sequences (sampled rows) as a step can
    hold, and the remaining tokens as the longest prefill chunks max_model_len allows."""
    num_seqs = max(1, min(max_num_seqs, num_tokens))
    lens = [1] * (num_seqs - 1)
    rest = num_tokens - len(lens)
    while rest > 0:
        lens.append(min(rest, max_model_len))
        rest -= lens[-1]
    return lens


def dummy_step(lens: list[int], block_size: int, sample: bool = True) -> tuple[StepInput, int]:
    """A step of fresh sequences of these lengths (token id 0) over blocks 0, 1, ... in order, every
    sequence sampled (unless not `sample`: an embedding engine's steps sample nothing); and the number of blocks
    it uses."""
    builder = StepBuilder(block_size)
    next_block = 0
    for n in lens:
        blocks = list(range(next_block, next_block + -(-n // block_size)))
        next_block += len(blocks)
        builder.add(blocks, [0] * n, 0, sample=sample)
    return builder.build(), next_block
