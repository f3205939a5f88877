"""What an answer reports over the request's prompts: its token usage and vLLM's prompt logprobs."""

from frontend.endpoints.openai_schemas.answer_fields import PromptLogprob, UsageInfo
from frontend.request_path.processor import ProcessedRequest


def usage(requests: list[ProcessedRequest], completion_tokens: int) -> UsageInfo:
    prompt_tokens = sum(len(r.prompt_token_ids) for r in requests)
    return UsageInfo(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                     total_tokens=prompt_tokens + completion_tokens)


def vllm_prompt_logprobs(requested: int | None, scored) -> list[dict[int, PromptLogprob] | None] | None:
    """vLLM's `prompt_logprobs` in a response: only where the request named the field."""
    if requested is None or scored is None:
        return None
    return [None if entry is None else
            {tid: PromptLogprob(logprob=lp.logprob, rank=lp.rank, decoded_token=lp.decoded_token)
             for tid, lp in entry.items()} for entry in scored]
