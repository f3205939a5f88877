"""A request's prompts made engine requests: each prompt processed once up front (so a bad request is a 400
before any stream starts), within the caps on sequences, characters and tokens; the same ProcessedRequests are
then streamed (engine_run.py)."""

from common.beam_search_params import BeamSearchParams
from common.errors import InvalidParameter
from common.lora import LoRARequest
from common.request_ids import part_id
from common.sampling_params import SamplingParams
from common.validation import request_token_cost
from frontend.async_engine.async_llm import AsyncLLM
from frontend.endpoints.serving import offload
from frontend.endpoints.serving.errors import APIError, bad_request
from frontend.endpoints.serving.state import MAX_SEQUENCES_PER_REQUEST, ServerState
from frontend.request_path.processor import ProcessedRequest


def check_sequences(prompts: list, params: SamplingParams, param: str = "prompt") -> None:
    if len(prompts) * params.n > MAX_SEQUENCES_PER_REQUEST:
        raise APIError(400, f"{param} x n asks for {len(prompts) * params.n} sequences; at most "
                       f"{MAX_SEQUENCES_PER_REQUEST} fit in one request", param=param)


async def process_prompts(state: ServerState, engine: AsyncLLM, request_id: str, prompts: list[str | list[int]],
                          params: SamplingParams, param: str = "prompt", cache_salt: str | None = None,
                          prompt_token_ids: list[list[int]] | None = None,
                          constraint_field: str | None = None,
                          max_tokens_field: str = "max_tokens",
                          beam_search: BeamSearchParams | None = None,
                          lora_request: LoRARequest | None = None) -> list[ProcessedRequest]:
    """One ProcessedRequest per prompt (tokenized and checked once; the same objects are then streamed),
    or a 400 naming the field (`param` is what this endpoint calls the prompt, `max_tokens_field` its output
    length; `constraint_field` what set the output constraint). Characters are counted first; big prompts, and every constraint (llguidance
    compiles it to check it), are processed off the event loop."""
    check_sequences(prompts, params, param)
    for prompt in prompts:
        if isinstance(prompt, str):
            state.check_chars(len(prompt), param)

    def work() -> list[ProcessedRequest]:
        processed, cost = [], 0
        for i, prompt in enumerate(prompts):
            rid = request_id if len(prompts) == 1 else part_id(request_id, i)
            ids = prompt_token_ids[i] if prompt_token_ids is not None else None
            try:
                request = engine.process(rid, prompt, params, prompt_token_ids=ids, cache_salt=cache_salt,
                                         constraint_field=constraint_field,  # the one check, with the constraint
                                         beam_search=beam_search, lora_request=lora_request)
            except InvalidParameter as e:
                # a beam search's width is the body's n
                raise bad_request(e, rename={"prompt": param, "max_tokens": max_tokens_field, "beam_width": "n"}) from None
            processed.append(request)
            cost += request_token_cost(request.params, request.params.max_tokens)
        limit = engine.limits.max_request_tokens
        if cost > limit:
            raise APIError(400, f"{max_tokens_field}: the request's prompts ask for n x {max_tokens_field} x "
                           f"(1 + logprobs) = {cost} in all, more than one request may ({limit}, "
                           "--max-request-tokens)", param=max_tokens_field)
        return processed

    size = offload.ALWAYS if params.structured_outputs is not None else sum(len(p) for p in prompts)
    return await offload.run(work, size)
