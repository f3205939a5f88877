"""A chat request started: checked (400s naming the field), planned, rendered, constrained and handed to the
engine. The chat endpoint and /v1/responses (which translates its body into a chat request) share it."""

import json
import logging
from dataclasses import dataclass

import msgspec

from common.errors import InvalidParameter
from common.sampling_params import SamplingParams
from frontend.endpoints.chat.constraint import with_constraint_after_reasoning
from frontend.endpoints.chat.plan import plan_chat
from frontend.endpoints.chat.render import render_chat
from frontend.endpoints.chat.schemas import ChatCompletionRequest
from frontend.endpoints.serving.engine_run import generate
from frontend.endpoints.serving.errors import APIError, bad_request
from frontend.endpoints.serving.prompts import check_sequences, process_prompts
from frontend.endpoints.serving.request_params import new_request_id, sampling_params
from frontend.endpoints.serving.state import ServerState
from frontend.output_parsers.reasoning import prompt_opens_reasoning

logger = logging.getLogger("nvllm")


@dataclass
class ChatRun:
    """A chat request checked, rendered and started in the engine: what its answer is read from. The chat
    endpoint and /v1/responses (which translates its body into a chat request) share it."""
    engine: object
    request_id: str
    params: SamplingParams
    prompts: list
    stream: object  # (prompt index, delta RequestOutput), as serving.engine_run.generate gives them
    formats: tuple  # (tool-call format, reasoning format, starts in reasoning): what ChatOutputReader takes
    lora: object
    constraint_field: str | None


async def start_chat(state: ServerState, body: ChatCompletionRequest, id_prefix: str = "chatcmpl") -> ChatRun:
    """The checks (400s naming the field), the template, the constraint and the engine request of a chat body."""
    engine = state.generating_engine()
    lora = state.check_model(body.model)
    if body.top_logprobs is not None and not body.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    if body.prompt_logprobs is not None and body.stream:  # as vLLM: a chat stream has no place for them
        raise APIError(400, "prompt_logprobs are not available with stream: true", param="prompt_logprobs")
    params, constraint_field = sampling_params(body)
    try:
        plan = plan_chat(body, engine.tokenizer, state.chat)
    except InvalidParameter as e:
        raise bad_request(e) from None
    if plan.tool_constraint is not None:
        if params.structured_outputs is not None:
            other = constraint_field or "structured_outputs"
            raise APIError(400, f"tool_choice required or naming a function is enforced with a grammar; it cannot go "
                           f"with {other}", param="tool_choice")
        constraint_field = "functions" if body.functions is not None else "tools"
    request_id = new_request_id(id_prefix)
    if body.metadata:
        logger.info("request %s metadata %s", request_id, json.dumps(body.metadata, ensure_ascii=False))
    check_sequences([body.messages], params, param="messages")
    ticket = state.admission.admit(params.n)  # 503 when overloaded, before any work
    try:
        text, ids = await render_chat(state, engine, body.messages, plan, body.add_generation_prompt)
        in_reasoning = prompt_opens_reasoning(text)
        params = msgspec.structs.replace(params, structured_outputs=with_constraint_after_reasoning(
            params.structured_outputs or plan.tool_constraint, plan, text, engine.tokenizer))
        prompts = await process_prompts(state, engine, request_id, [text], params, param="messages",
                                          cache_salt=body.cache_salt, prompt_token_ids=[ids],
                                          constraint_field=constraint_field, max_tokens_field=body.max_tokens_field,
                                          lora_request=lora)
    except BaseException:
        ticket.release()
        raise
    stream = generate(state, engine, prompts, ticket, constraint_field)
    return ChatRun(engine, request_id, params, prompts, stream, (plan.tool_parser, plan.reasoning_parser, in_reasoning),
                   lora, constraint_field)
