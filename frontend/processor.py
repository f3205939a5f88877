"""Turns a user's prompt and parameters into a validated EngineCoreRequest.

The checks are the engine core's own (common/validation.py, with the limits the core sent in READY),
so what passes here passes there. Every message names the field and its limit, so the HTTP layer can
return it as a 400 unchanged. The HTTP server counts a prompt's characters before it gets here
(--max-prompt-chars); `max_prompt_chars` does the same for other callers that want it.
"""

import time

import msgspec

from common.limits import RequestLimits
from common.protocol import EngineCoreRequest, Ready
from common.sampling_params import SamplingParams
from common.validation import check_request

Prompt = str | list[int]


class Processor:
    def __init__(self, tokenizer, limits: RequestLimits, eos_token_ids: list[int],
                 max_prompt_chars: int | None = None):
        self.tokenizer = tokenizer
        self.limits = limits
        self.max_model_len = limits.max_model_len
        self.vocab_size = limits.vocab_size
        self.eos_token_ids = list(eos_token_ids)
        self.max_prompt_chars = max_prompt_chars

    @classmethod
    def for_model(cls, tokenizer, info: Ready, **kwargs) -> "Processor":
        limits = msgspec.structs.replace(info.limits, vocab_size=info.vocab_size, max_model_len=info.max_model_len)
        return cls(tokenizer, limits, info.eos_token_ids, **kwargs)

    def tokenize(self, prompt: Prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("prompt must not be empty")
            if self.max_prompt_chars is not None and len(prompt) > self.max_prompt_chars:
                raise ValueError(f"prompt has {len(prompt)} characters, more than the {self.max_prompt_chars} "
                                 f"allowed (--max-prompt-chars)")
            return prompt, self.tokenizer.encode(prompt)
        if not isinstance(prompt, (list, tuple)) or not all(isinstance(t, int) for t in prompt):
            raise ValueError("prompt must be a string or a list of token ids")
        return None, list(prompt)

    def process(self, request_id: str, prompt: Prompt, params: SamplingParams,
                prompt_token_ids: list[int] | None = None,
                cache_salt: str | None = None) -> tuple[str | None, EngineCoreRequest]:
        params.validate()
        text, ids = (None, prompt_token_ids) if prompt_token_ids is not None else self.tokenize(prompt)
        if params.max_tokens is None:  # as many as fit (check_request names the prompt first if none do)
            params = msgspec.structs.replace(params, max_tokens=max(1, self.max_model_len - len(ids)))
        request = EngineCoreRequest(request_id=request_id, prompt_token_ids=ids, sampling_params=params,
                                    eos_token_ids=self.eos_token_ids, arrival_time=time.time(),
                                    cache_salt=cache_salt)
        check_request(request, self.limits)
        return text, request


def child_request(request: EngineCoreRequest, child_id: str, index: int) -> EngineCoreRequest:
    """The core request for sample `index` of a request with n > 1 (or the request itself)."""
    params = request.sampling_params
    if params.n > 1 and params.seed is not None:
        params = msgspec.structs.replace(params, seed=params.seed + index)  # n samples, not n copies
    return msgspec.structs.replace(request, request_id=child_id, sampling_params=params)
