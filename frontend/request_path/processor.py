"""Turns a user's prompt and parameters into one ProcessedRequest, made once per request.

The checks are the engine core's own (common/validation.py, with the limits the core sent in READY),
so what passes here passes there. Every error is an InvalidParameter naming the field and its limit,
so the HTTP layer returns it as a 400 unchanged. The HTTP server counts a prompt's characters before
it gets here (--max-prompt-chars); `max_prompt_chars` does the same for other callers that want it.
"""

import hashlib
import time
from dataclasses import dataclass

import msgspec

from common.beam_search_params import BeamSearchParams
from common.errors import InvalidParameter, invalid
from common.limits import RequestLimits
from common.lora import LoRARequest
from common.pooling_params import PoolingParams
from common.request_ids import sample_id
from common.sampling_params import RequestOutputKind, SamplingParams
from common.validation import check_request
from common.wire_messages import EngineCoreRequest, Ready

Prompt = str | list[int]

_wire = msgspec.msgpack.Encoder()


@dataclass(frozen=True)
class ProcessedRequest:
    """Everything one request is, validated: what the OutputProcessor registers and the core client sends.
    `core_requests` holds one core request per sample (n of them; the request itself when n is 1)."""
    request_id: str
    prompt: str | None  # None for a prompt given as token ids
    prompt_token_ids: list[int]
    params: SamplingParams  # validated, max_tokens filled in
    core_requests: list[EngineCoreRequest]
    model_fingerprint: str  # the model (tokenizer, limits) it was tokenized and checked for
    beam_search: BeamSearchParams | None = None  # a beam search: one core request, beam_width outputs at the end
    pooling_params: PoolingParams | None = None  # an embedding request: one core request, its vector at the end


def model_fingerprint(info: Ready) -> str:
    """Equal for cores a frontend can use interchangeably: same model, limits, tokenizer and runner (a pooling
    core answers embedding requests only)."""
    runner = [info.limits.runner] if info.limits.runner != "generate" else []
    blob = msgspec.msgpack.encode([info.model_name, info.max_model_len, info.vocab_size, sorted(info.eos_token_ids),
                                   sorted(info.tokenizer_files.items())] + runner)
    return hashlib.sha256(blob).hexdigest()


class Processor:
    def __init__(self, tokenizer, limits: RequestLimits, eos_token_ids: list[int],
                 max_prompt_chars: int | None = None, fingerprint: str = ""):
        self.tokenizer = tokenizer
        self.limits = limits
        self.max_model_len = limits.max_model_len
        self.eos_token_ids = list(eos_token_ids)
        self.max_prompt_chars = max_prompt_chars
        self.fingerprint = fingerprint

    @classmethod
    def for_model(cls, tokenizer, info: Ready, **kwargs) -> "Processor":
        limits = msgspec.structs.replace(info.limits, vocab_size=info.vocab_size, max_model_len=info.max_model_len)
        return cls(tokenizer, limits, info.eos_token_ids, fingerprint=model_fingerprint(info), **kwargs)

    def tokenize(self, prompt: Prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            if not prompt:
                raise invalid("prompt", "must not be empty")
            if self.max_prompt_chars is not None and len(prompt) > self.max_prompt_chars:
                raise invalid("prompt", f"has {len(prompt)} characters, more than the {self.max_prompt_chars} "
                                        f"allowed (--max-prompt-chars)")
            return prompt, self.tokenizer.encode(prompt)
        if not isinstance(prompt, (list, tuple)) or not all(isinstance(t, int) for t in prompt):
            raise invalid("prompt", "must be a string or a list of token ids")
        return None, list(prompt)

    def process(self, request_id: str, prompt: Prompt, params: SamplingParams,
                prompt_token_ids: list[int] | None = None, cache_salt: str | None = None,
                constraint_field: str | None = None, beam_search: BeamSearchParams | None = None,
                lora_request: LoRARequest | None = None) -> ProcessedRequest:
        """Raises InvalidParameter naming the first bad field; what returns can go on the wire. This is the
        frontend's one check of a request (check_request: every field, the constraint compiled, named
        `constraint_field` where the caller's API calls it something else)."""
        text, ids = (prompt if isinstance(prompt, str) else None, prompt_token_ids) \
            if prompt_token_ids is not None else self.tokenize(prompt)
        if beam_search is not None:
            # the beams choose their tokens by logprob alone: of the sampling parameters only what shapes the
            # text stays (the max_tokens check against the prompt is the beams')
            params = SamplingParams(n=beam_search.beam_width, max_tokens=beam_search.max_tokens,
                                    skip_special_tokens=params.skip_special_tokens, output_kind=params.output_kind)
        if params.max_tokens is None:  # as many as fit (check_request names the prompt first if none do)
            params = msgspec.structs.replace(params, max_tokens=max(1, self.max_model_len - len(ids)))
        request = EngineCoreRequest(request_id=request_id, prompt_token_ids=ids, sampling_params=params,
                                    eos_token_ids=self.eos_token_ids, arrival_time=time.time(),
                                    cache_salt=cache_salt, beam_search=beam_search, lora_request=lora_request)
        check_request(request, self.limits, compile_constraint=True, constraint_field=constraint_field)
        try:  # what cannot go on the wire must fail here, not once a stream has begun
            _wire.encode(request)
        except (OverflowError, UnicodeError, msgspec.EncodeError) as e:
            raise InvalidParameter(None, f"a parameter is out of range or not valid UTF-8: {e}") from None
        # n samples are n core requests; a beam search's n beams are one
        samples = [request] if beam_search is not None else [_sample(request, i) for i in range(params.n)]
        return ProcessedRequest(request_id, text, ids, params, samples, self.fingerprint, beam_search)


    def process_embedding(self, request_id: str, prompt: Prompt, pooling_params: PoolingParams | None = None,
                          lora_request: LoRARequest | None = None) -> ProcessedRequest:
        """An embedding request (the engine must run --runner pooling): InvalidParameter names a bad field
        (`prompt` too long for max_model_len, `dimensions` the model cannot truncate to, `model` on a generating
        engine)."""
        text, ids = self.tokenize(prompt)
        pooling_params = pooling_params if pooling_params is not None else PoolingParams()
        params = SamplingParams(output_kind=RequestOutputKind.FINAL_ONLY)  # nothing is sampled: one final output
        request = EngineCoreRequest(request_id=request_id, prompt_token_ids=ids, sampling_params=params,
                                    eos_token_ids=self.eos_token_ids, arrival_time=time.time(),
                                    lora_request=lora_request, pooling_params=pooling_params)
        check_request(request, self.limits)
        return ProcessedRequest(request_id, text, ids, params, [request], self.fingerprint,
                                pooling_params=pooling_params)


def _sample(request: EngineCoreRequest, index: int) -> EngineCoreRequest:
    """The core request for sample `index` of the request's n."""
    params = request.sampling_params
    if params.n == 1:
        return request
    if params.seed is not None:
        params = msgspec.structs.replace(params, seed=params.seed + index)  # n samples, not n copies
    if index > 0 and params.prompt_logprobs is not None:
        params = msgspec.structs.replace(params, prompt_logprobs=None)  # the samples share one prompt: score it once
    return msgspec.structs.replace(request, request_id=sample_id(request.request_id, index, params.n),
                                   sampling_params=params)
