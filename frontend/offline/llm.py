"""The offline API: `LLM(model).generate(prompts, params)`, like vLLM's.

The requests of a generate() call are records in the output processor's RequestTracker until they finish;
this file keeps no request state of its own, only the finished outputs it returns."""

import itertools
import time
from typing import Sequence

import msgspec
from tqdm.auto import tqdm

from common.beam_search_params import BeamSearchParams
from common.config import EngineArgs
from common.errors import InvalidParameter
from common.lora import LoRARequest
from common.pooling_params import PoolingParams
from common.sampling_params import RequestOutputKind, SamplingParams
from common.validation import NOT_POOLING, POOLING_SERVED, check_lora_request
from frontend.core_link.core_client import InprocClient
from frontend.request_path.chat_template import render_chat
from frontend.request_path.outputs import BeamSearchOutput, BeamSearchSequence, EmbeddingRequestOutput, RequestOutput
from frontend.request_path.processor import ProcessedRequest
from frontend.request_path.request_tracing import request_tracing_for
from frontend.request_path.served_model import ServedModel

PromptType = str | list[int] | dict  # dict: vLLM's {"prompt": text} or {"prompt_token_ids": ids}


class LLM:
    """A model loaded for offline use, shaped like vLLM's `LLM`.

    The engine core runs in a child process (`multiprocess=False` keeps it in this process, for debugging);
    `LLM.connect(address)` uses a core that is already running. Use it as a context manager, or call
    `shutdown()`, to stop the child.

    Args:
        model: an HF model folder, a `.gguf` file, or None for the embedded default model
            (SmolLM2-135M-Instruct).
        multiprocess: run the engine core in a child process (the default) or in this one.
        **engine_args: any `EngineArgs` field, e.g. `dtype="float32"`, `max_model_len=4096`,
            `kv_cache_memory="2GiB"`, `enable_lora=True`; the same settings as `nvllm serve`'s flags.
    """

    tracing = None  # a RequestTracing (frontend/request_path/request_tracing.py) when otlp_traces_endpoint is given

    def __init__(self, model: str | None = None, multiprocess: bool = True, **engine_args: object):
        self.engine_args = EngineArgs(model=model, **({"usage": "offline"} | engine_args))
        self.engine_args.validate()
        self.client = self._make_client(multiprocess)
        self.tracing = request_tracing_for(self.engine_args.otlp_traces_endpoint)
        self._setup()

    @classmethod
    def connect(cls, address: str, socket_setup=None) -> "LLM":
        """An LLM on an engine core that is already running at `address`."""
        from frontend.core_link.core_client_mp import SyncMPClient
        llm = cls.__new__(cls)
        llm.engine_args = None
        llm.client = SyncMPClient(None, address, socket_setup)
        llm._setup()
        return llm

    def _setup(self) -> None:
        model = ServedModel.from_ready(self.client.model_info, tracing=self.tracing)
        self.model_info, self.tokenizer = model.info, model.tokenizer
        self.processor, self.output_processor = model.processor, model.output_processor
        self.requests = model.output_processor.tracker
        self._ids = itertools.count()

    def _make_client(self, multiprocess: bool):
        if multiprocess:
            from frontend.core_link.core_client_mp import SyncMPClient
            return SyncMPClient(self.engine_args)
        return InprocClient(self.engine_args)

    def get_tokenizer(self):
        """The model's tokenizer (a transformers tokenizer)."""
        return self.tokenizer

    def generate(self, prompts: PromptType | Sequence[PromptType],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True,
                 lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None) -> list[RequestOutput]:
        """Generate a completion for each prompt, all prompts batched together.

        Args:
            prompts: a text, a list of token ids, `{"prompt": text}` or `{"prompt_token_ids": ids}`, or a list
                of those.
            sampling_params: one `SamplingParams` for every prompt or one per prompt (default: `SamplingParams()`).
            use_tqdm: show a progress bar with prefill and decode rates.
            lora_request: one adapter for every prompt, or a list with one (or None: the base model) per prompt;
                a LoRA adapter the engine cannot apply is a ValueError naming it, before any prompt runs.

        Returns:
            One `RequestOutput` per prompt, in the prompts' order.

        Raises:
            ValueError: a sampling parameter out of range (the message names the field and its limit), or the
                model is served for embeddings.
        """
        if self.model_info.limits.runner == "pooling":
            raise ValueError(POOLING_SERVED)
        prompts = _prompt_list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params] * len(prompts)
        if len(sampling_params) != len(prompts):
            raise ValueError(f"sampling_params has {len(sampling_params)} entries for {len(prompts)} prompts")
        loras = self._lora_requests(lora_request, len(prompts))
        # validate every prompt before the first reaches the core, so a bad one leaves nothing behind
        processed = [self._process(prompt, params, lora_request=lora)
                     for prompt, params, lora in zip(prompts, sampling_params, loras)]
        return self._submit_and_run(processed, use_tqdm)

    def beam_search(self, prompts: PromptType | Sequence[PromptType], params: BeamSearchParams,
                    use_tqdm: bool = False, lora_request=None) -> list[BeamSearchOutput]:
        """Per prompt, params.beam_width beams best score first (vLLM's LLM.beam_search). Each prompt is one
        request that the engine core searches on its own (engine_core/sched/beam_group.py); lora_request as in
        generate."""
        prompts = _prompt_list(prompts)
        loras = self._lora_requests(lora_request, len(prompts))
        processed = [self._process(prompt, SamplingParams(), params, lora_request=lora)
                     for prompt, lora in zip(prompts, loras)]
        results = []
        for out in self._submit_and_run(processed, use_tqdm):
            if len(out.outputs) == 1 and out.outputs[0].finish_reason == "error":
                raise RuntimeError(f"beam search failed: {out.outputs[0].stop_reason}")
            results.append(BeamSearchOutput([
                BeamSearchSequence(out.prompt_token_ids + c.token_ids,
                                   self.tokenizer.decode(out.prompt_token_ids + c.token_ids, skip_special_tokens=True),
                                   c.cumulative_logprob, c.score, c.finish_reason, c.token_ids, c.text)
                for c in out.outputs]))
        return results

    def embed(self, prompts: PromptType | Sequence[PromptType], pooling_params: PoolingParams | None = None,
              use_tqdm: bool = True, lora_request=None) -> list[EmbeddingRequestOutput]:
        """Per prompt, its pooled vector (vLLM's LLM.embed): `.outputs.embedding`. The engine must run
        runner="pooling" (a ValueError says so otherwise); pooling_params: `dimensions` (Matryoshka models) and
        `normalize` for every prompt; lora_request as in generate."""
        if self.model_info.limits.runner != "pooling":
            raise ValueError(NOT_POOLING)
        prompts = _prompt_list(prompts)
        loras = self._lora_requests(lora_request, len(prompts))
        processed = []
        for prompt, lora in zip(prompts, loras):
            prompt = prompt_of(prompt) if isinstance(prompt, dict) else prompt
            processed.append(self.processor.process_embedding(str(next(self._ids)), prompt, pooling_params, lora))
        outputs = self._submit_and_run(processed, use_tqdm)
        for out in outputs:
            if out.error is not None:
                raise RuntimeError(f"embedding request {out.request_id} failed: {out.error}")
        return outputs

    def _lora_requests(self, lora_request, count: int) -> list[LoRARequest | None]:
        """One adapter (or None) per prompt, each checked by the core once (it reads the adapter's files)."""
        if lora_request is None or isinstance(lora_request, LoRARequest):
            loras = [lora_request] * count
        else:
            loras = list(lora_request)
            if len(loras) != count:
                raise ValueError(f"lora_request has {len(loras)} entries for {count} prompts")
        for lora in {lora.key: lora for lora in loras if lora is not None}.values():
            if not isinstance(lora, LoRARequest):
                raise ValueError(f"lora_request entries must be LoRARequest or None, got {type(lora).__name__}")
            check_lora_request(lora)
            if not self.model_info.enable_lora:
                raise ValueError(f"LoRA adapter {lora.lora_name!r}: LoRA serving is off (LLM(..., enable_lora=True))")
            self.client.add_lora(lora)
        return loras

    def chat(self, messages: list[dict] | list[list[dict]], sampling_params=None, use_tqdm: bool = True,
             add_generation_prompt: bool = True, chat_template: str | None = None,
             lora_request=None) -> list[RequestOutput]:
        """Answer a conversation (a list of `{"role": ..., "content": ...}` messages) or a list of them, through
        the model's chat template, as `generate` does for prompts (`RequestOutput.prompt` is the rendered
        template). `chat_template` replaces the model's own template (Jinja text)."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        # special tokens come from the template only: a message that spells one gets it as text
        rendered = [render_chat(self.tokenizer, c, add_generation_prompt, chat_template) for c in conversations]
        prompts, ids = [text for text, _ in rendered], [ids for _, ids in rendered]
        outs = self.generate(ids, sampling_params, use_tqdm, lora_request)
        for out, text in zip(outs, prompts):
            out.prompt = text
        return outs

    def _process(self, prompt: PromptType, params: SamplingParams,
                 beam_search: BeamSearchParams | None = None,
                 lora_request: LoRARequest | None = None) -> ProcessedRequest:
        # the offline API returns only finished requests: skip the per-token outputs
        params = msgspec.structs.replace(params, output_kind=RequestOutputKind.FINAL_ONLY)
        if isinstance(prompt, dict):
            prompt = prompt_of(prompt)
        return self.processor.process(str(next(self._ids)), prompt, params, beam_search=beam_search,
                                      lora_request=lora_request)

    def _submit_and_run(self, processed: list[ProcessedRequest], use_tqdm: bool) -> list[RequestOutput]:
        for request in processed:
            for core_request in self.output_processor.add_request(request):
                self.client.add_request(core_request)
        return self._run([request.request_id for request in processed], use_tqdm)

    def _run(self, order: list[str], use_tqdm: bool) -> list[RequestOutput]:
        finished: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(order), desc="Processed prompts", dynamic_ncols=True, disable=not use_tqdm)
        start, prompt_tokens, output_tokens = time.perf_counter(), 0, 0
        try:
            while len(finished) < len(order):  # each request's record leaves the tracker with its final output
                outputs = self.client.get_output()
                results, to_abort = self.output_processor.process_outputs(outputs)
                self.client.abort_requests(to_abort)
                step = outputs.scheduler_stats.step if outputs.scheduler_stats is not None else None
                if step is not None:  # a heartbeat carries none: its tokens were counted with their step
                    prompt_tokens += step.num_prompt_tokens
                    output_tokens += step.num_generation_tokens
                for _, ro in results:
                    if ro.finished:
                        finished[ro.request_id] = ro
                        bar.update(1)
                elapsed = time.perf_counter() - start
                bar.set_postfix_str(f"prefill {prompt_tokens / elapsed:.0f} tok/s, "
                                    f"decode {output_tokens / elapsed:.0f} tok/s", refresh=False)
        except BaseException:
            for rid in order:
                self.client.abort_requests(self.output_processor.abort_request(rid))  # [] if it finished
            raise
        finally:
            bar.close()
        return [finished[rid] for rid in order]

    def get_stats(self):
        """The core's SchedulerStats: running and waiting requests, free KV blocks, cache hits."""
        return self.client.get_stats()

    def reset_prefix_cache(self) -> bool:
        """Drop every cached prompt block that no running request holds; False when some are still held."""
        return self.client.reset_prefix_cache()

    def shutdown(self) -> None:
        """Stop the engine core (its child process) and flush tracing."""
        self.client.shutdown()
        if self.tracing is not None:
            self.tracing.shutdown()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()


def prompt_of(prompt: dict) -> str | list[int]:
    """The text or token ids of a vLLM-style prompt dict; one of its two keys, nothing else."""
    keys = set(prompt)
    if keys in ({"prompt"}, {"prompt_token_ids"}):
        return prompt[keys.pop()]
    raise InvalidParameter("prompt", f"prompt as a dict must hold one key, 'prompt' (text) or 'prompt_token_ids' "
                                     f"(ids); got keys {sorted(keys)}")


def _prompt_list(prompts) -> list:
    """One prompt (text, token ids or a dict) or a sequence of them, as a list."""
    if isinstance(prompts, (str, dict)) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
        return [prompts]
    return list(prompts)
