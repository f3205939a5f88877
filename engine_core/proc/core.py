"""EngineCore: the scheduler and the executor behind an in-process interface.

add_request / abort_requests / step() -> EngineCoreOutputs. The ZMQ process wraps exactly this.
"""

import logging
import time
import uuid

import msgspec

from common.config import EngineArgs
from common.errors import InvalidParameter
from common.lora import LoRARequest
from common.validation import check_lora_request
from common.wire_messages import (PROTOCOL_VERSION, EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest, Ready,
                                  StepCounts)
from engine_core.platform.cpu_threads import ThreadPoolSizer
from engine_core.engine_config import resolve_engine_config
from engine_core.executor.fatal_errors import is_fatal
from engine_core.proc.request_spans import request_spans_for
from engine_core.sched.beam_group import BeamGroup
from engine_core.sched.kv_cache_manager import KVCacheManager
from engine_core.weights.model_folder import eos_token_ids, read_tokenizer_files
from engine_core.sched.request import Request
from engine_core.sched.scheduler import Scheduler, SchedulerConfig
from engine_core.spec_decode.proposer import speculator_for
from engine_core.structured_outputs.grammar_compiler import GrammarCompiler
from engine_core.structured_outputs.request_grammar import RequestGrammar
from engine_core.worker.step_input import StepResult

logger = logging.getLogger("nvllm")

GRAMMAR_WAIT_SECONDS = 0.05  # an idle step's wait for a compiling grammar: short, so inputs stay responsive


def attention_reach(config) -> int | None:
    """Keys any query reads back (the scheduler frees blocks older than that), where every layer of the model, and
    of a draft model sharing its block tables, slides; None: some layer reads every key."""
    reaches = [config.model.spec.attention_reach]
    if config.draft_model is not None:
        reaches.append(config.draft_model.spec.attention_reach)
    return None if None in reaches else max(reaches)


def pooling_limits(config) -> dict:
    """RequestLimits' embedding fields: the runner, the vector size, and the Matryoshka sizes config.json allows
    (`is_matryoshka`: any size; `matryoshka_dimensions`: those)."""
    if config.runner != "pooling":
        return {}
    hf = config.model.hf_config
    sizes = tuple(int(d) for d in hf.get("matryoshka_dimensions") or ())
    return {"runner": "pooling", "embedding_size": config.model.spec.hidden_size,
            "matryoshka": bool(hf.get("is_matryoshka")) or bool(sizes), "matryoshka_dimensions": sizes}


class EngineCore:
    def __init__(self, args: EngineArgs, executor_class=None):
        self.args = args  # what the user asked for, never changed; everything below reads self.config
        self.config = config = resolve_engine_config(args)
        if executor_class is None:
            from engine_core.executor.factory import executor_class_for
            executor_class = executor_class_for(config)
        self.cpu_threads = (ThreadPoolSizer(config.cpu_threads, fixed=config.cpu_threads is not None)
                            if config.device == "cpu" and config.parallel.is_single_process else None)
        self.executor = executor_class(config)
        num_blocks, per_block = self.executor.num_blocks_for_budget()
        block_size, max_model_len = config.block_size, config.max_model_len
        capacity = num_blocks * block_size
        if capacity < max_model_len:
            self.executor.shutdown()
            raise ValueError(
                f"kv_cache_memory holds {capacity} tokens ({num_blocks} blocks of {block_size}), fewer than "
                f"max_model_len {max_model_len}: raise --kv-cache-memory (or --gpu-memory-utilization) "
                f"to at least {-(-max_model_len // block_size) * per_block} bytes, "
                f"or lower --max-model-len")
        self.executor.initialize_cache(num_blocks)
        logger.info("KV cache: %d blocks x %d tokens = %d tokens (%.2f GiB, %s)", num_blocks, block_size,
                    capacity, num_blocks * per_block / 2**30, config.dtype)
        self.kv_cache_manager = KVCacheManager(num_blocks, block_size, config.enable_prefix_caching,
                                               attention_reach(config), self.executor.prompt_arithmetic())
        self.scheduler = Scheduler(SchedulerConfig(
            max_num_seqs=config.max_num_seqs, max_num_batched_tokens=config.max_num_batched_tokens,
            max_model_len=max_model_len, block_size=block_size,
            enable_prefix_caching=config.enable_prefix_caching,
            max_loras=config.lora.max_loras if config.lora is not None else None), self.kv_cache_manager,
            speculator_for(config.speculative_config))
        self.num_blocks = num_blocks
        limits = args.request_limits(config.model.vocab_size, max_model_len)
        # a beam search runs all its beams in one step
        self.limits = msgspec.structs.replace(limits, max_beam_width=min(
            limits.max_n, config.max_num_seqs, config.max_num_batched_tokens), **pooling_limits(config))
        tokenizer_files = read_tokenizer_files(config.model.path)
        self.grammar_compiler = GrammarCompiler(tokenizer_files.get("tokenizer.json", ""), config.model.vocab_size,
                                                eos_token_ids(config.model.path, config.model.hf_config))
        self.core_id = uuid.uuid4().hex
        # tracing (proc/request_spans.py): None unless --otlp-traces-endpoint; then only requests that carry trace
        # headers are traced
        self.spans = request_spans_for(args.otlp_traces_endpoint)

    @property
    def max_model_len(self) -> int:
        return self.config.max_model_len

    def model_info(self) -> Ready:
        """What a frontend needs to serve this model without a copy of it."""
        return Ready(
            protocol_version=PROTOCOL_VERSION,
            core_id=self.core_id,
            model_name=self.args.served_model_name or self._default_name(),
            max_model_len=self.config.max_model_len,
            vocab_size=self.config.model.vocab_size,
            eos_token_ids=eos_token_ids(self.config.model.path, self.config.model.hf_config),
            tokenizer_files=read_tokenizer_files(self.config.model.path),
            num_gpu_blocks=self.num_blocks,
            block_size=self.config.block_size,
            dtype=self.config.dtype,
            limits=self.limits,
            enable_lora=self.config.lora is not None,
        )

    def _default_name(self) -> str:
        return self.args.model or "SmolLM2-135M-Instruct"

    # ---- the in-process interface -------------------------------------------------------------

    def add_request(self, request: EngineCoreRequest) -> None:
        """Takes a request already checked against `self.limits` (common/validation.py): by the frontend's
        Processor in this process, or by the core process on the ADD it decoded. Its output constraint, if
        any, starts compiling now, off this thread."""
        core_request = Request.from_engine_core_request(request)
        if request.pooling_params is not None and self.config.pooler is not None:
            core_request.pools_every_position = self.config.pooler.pooling_type != "LAST"
        if request.beam_search is not None:
            BeamGroup(core_request, request.beam_search, self.config.model.vocab_size)
        constraint = request.sampling_params.structured_outputs
        if constraint is not None:
            core_request.grammar = RequestGrammar(self.grammar_compiler.compile(constraint),
                                                  constraint.starts_after_token_ids,
                                                  f"structured_outputs.{constraint.kinds()[0]}")
        if request.trace_headers is not None and self.spans is not None:
            self.spans.start(request)
        self.scheduler.add_request(core_request)

    def add_lora(self, lora: LoRARequest) -> None:
        """Reads and checks the adapter now (kept for its first step); ValueError naming it and what is wrong,
        or that LoRA serving is off."""
        check_lora_request(lora)
        runner = self.executor.runner
        if runner.lora is None:
            raise InvalidParameter("lora_request", f"LoRA adapter {lora.lora_name!r}: LoRA serving is off "
                                                   f"(start the engine with --enable-lora)")
        runner.lora.read(lora)

    def remove_lora(self, lora: LoRARequest) -> bool:
        """Forgets the adapter's kept copy (a running request's slot stays until it is done)."""
        runner = self.executor.runner
        if runner.lora is not None:
            runner.lora.forget(lora)
        return True

    def abort_requests(self, request_ids: list[str]) -> None:
        outputs = self.scheduler.abort_requests(request_ids)
        self.executor.forget_requests([o.request_id for o in outputs])
        self.scheduler.report_with_next_update(outputs)  # the notices go out with the next step

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def step(self) -> EngineCoreOutputs:
        """One schedule -> execute -> update. An exception in it fails the step's requests (ERROR
        outputs, blocks freed) and the core goes on; only a fatal one (executor/fatal_errors.is_fatal) propagates."""
        outputs: list[EngineCoreOutput] = []
        step = StepCounts()  # nothing to run: a step that computed nothing
        if self.scheduler.has_unfinished_requests():  # also while abort notices wait in the scheduler
            sched_out = None
            try:
                sched_out = self.scheduler.schedule()
                result = StepResult({}, {}, {})
                if sched_out.total_num_scheduled_tokens > 0:
                    if self.cpu_threads is not None:
                        self.cpu_threads.update()
                    result = self.executor.execute_model(sched_out)
                else:  # only requests whose grammars compile: wait a moment for one rather than spin
                    self.scheduler.wait_for_grammars(GRAMMAR_WAIT_SECONDS)
                step_outputs = self.scheduler.update_from_output(sched_out, result.sampled, result.logprobs,
                                                                 result.prompt_logprobs, result.embeddings)
            except Exception as e:
                if is_fatal(e):
                    raise
                step_outputs = self._fail_step(sched_out, e)
            self.executor.forget_requests([o.request_id for o in step_outputs if o.finish_reason is not None])
            outputs, step = step_outputs, self.scheduler.step_counts()
            if self.spans is not None and self.spans.live:
                self.spans.after_step(sched_out, outputs)
        stats = self.scheduler.get_stats()
        stats.step = step
        return EngineCoreOutputs(outputs=outputs, scheduler_stats=stats, timestamp=time.time())

    def _fail_step(self, sched_out, error: Exception) -> list[EngineCoreOutput]:
        if sched_out is not None:
            requests = [s.request for s in sched_out.scheduled]
            before = {s.request.request_id: s.num_computed_tokens_before for s in sched_out.scheduled}
        else:  # schedule() itself failed: the running requests and the one it was admitting
            requests = list(self.scheduler.running) + list(self.scheduler.waiting)[:1]
            before = {r.request_id: r.num_computed_tokens for r in self.scheduler.running}
        logger.exception("an engine step failed; failing its %d request(s) and going on: %s: %s",
                         len(requests), type(error).__name__, error, exc_info=error)
        message = f"the engine failed this request's step: {type(error).__name__}: {error}"
        return self.scheduler.fail_requests(requests, message[:2000], before)

    def on_executor_failure(self, wake) -> None:
        """`wake()` is called from another thread when the executor fails while no step runs (a
        tensor-parallel rank died): it must only wake the caller's loop, which then calls check_health."""
        self.executor.on_failure(wake)

    def check_health(self) -> None:
        """Raises the executor's fatal error (executor/fatal_errors.is_fatal) once it has one."""
        self.executor.check_health()

    def reset_prefix_cache(self) -> bool:
        return self.kv_cache_manager.reset_prefix_cache()

    def shutdown(self) -> None:
        if self.spans is not None:
            self.spans.shutdown()
        self.grammar_compiler.shutdown()
        self.executor.shutdown()
