"""Turns a user's prompt and parameters into a validated EngineCoreRequest.

Every check names the field and its limit, so the HTTP layer can return it as a 400 unchanged.
"""

import time

import msgspec

from common.protocol import EngineCoreRequest
from common.sampling_params import SamplingParams

Prompt = str | list[int]


class Processor:
    def __init__(self, tokenizer, max_model_len: int, vocab_size: int, eos_token_ids: list[int]):
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.eos_token_ids = list(eos_token_ids)

    def tokenize(self, prompt: Prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("prompt must not be empty")
            return prompt, self.tokenizer.encode(prompt)
        if not isinstance(prompt, (list, tuple)) or not all(isinstance(t, int) for t in prompt):
            raise ValueError("prompt must be a string or a list of token ids")
        return None, list(prompt)

    def process(self, request_id: str, prompt: Prompt, params: SamplingParams,
                prompt_token_ids: list[int] | None = None) -> tuple[str | None, EngineCoreRequest]:
        params.validate()
        text, ids = (None, prompt_token_ids) if prompt_token_ids is not None else self.tokenize(prompt)
        self.check_prompt(ids)
        params = self._fill_max_tokens(params, len(ids))
        request = EngineCoreRequest(request_id=request_id, prompt_token_ids=ids, sampling_params=params,
                                    eos_token_ids=self.eos_token_ids, arrival_time=time.time())
        return text, request

    def check_prompt(self, ids: list[int]) -> None:
        if not ids:
            raise ValueError("prompt must not be empty (it has 0 tokens)")
        bad = next((t for t in ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise ValueError(f"prompt token id {bad} is outside the vocabulary [0, {self.vocab_size})")
        if len(ids) >= self.max_model_len:
            raise ValueError(f"prompt has {len(ids)} tokens, which leaves no room to generate within "
                             f"max_model_len {self.max_model_len}")

    def _fill_max_tokens(self, params: SamplingParams, num_prompt: int) -> SamplingParams:
        room = self.max_model_len - num_prompt
        if params.max_tokens is None:
            return msgspec.structs.replace(params, max_tokens=room)
        if params.max_tokens > room:
            raise ValueError(f"max_tokens {params.max_tokens} plus the prompt's {num_prompt} tokens exceeds "
                             f"max_model_len {self.max_model_len} (at most {room} new tokens fit)")
        return params


def child_request(request: EngineCoreRequest, child_id: str, index: int) -> EngineCoreRequest:
    """The core request for sample `index` of a request with n > 1 (or the request itself)."""
    params = request.sampling_params
    if params.n > 1 and params.seed is not None:
        params = msgspec.structs.replace(params, seed=params.seed + index)  # n samples, not n copies
    return msgspec.structs.replace(request, request_id=child_id, sampling_params=params)
