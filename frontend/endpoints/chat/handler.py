"""POST /v1/chat/completions: messages rendered with the model's chat template, streamed or whole.

A stream begins with one {"role": "assistant", "content": ""} delta per choice, then content deltas
token by token; the last delta of a choice carries its finish_reason.
"""

import json
import logging
from dataclasses import dataclass

import msgspec
from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from frontend.request_path import chat_template
from frontend.endpoints.serving import prompts as G
from frontend.endpoints.serving import offload
from common.errors import InvalidParameter
from common.sampling_params import SamplingParams
from frontend.endpoints.chat.output import ChatOutputReader, finish_reason, legacy_finish_reason, read_whole
from frontend.endpoints.chat.plan import ChatPlan, plan_chat, with_constraint_after_reasoning
from frontend.endpoints.serving.errors import APIError, bad_request
from frontend.endpoints.openai_schemas.shared_fields import (ChatChoice, ChatChoiceLogprobs, ChatCompletionRequest,
                                                             ChatCompletionResponse, ChatCompletionStreamResponse,
                                                             ChatMessage, ChatResponseMessage, ChatStreamChoice,
                                                             ChatTokenLogprob, ChatTopLogprob, DeltaMessage)
from frontend.endpoints.serving.state import ServerState
from frontend.endpoints.serving.streams import ClientDisconnected, cancel_on_disconnect, sse
from frontend.request_path.outputs import Logprob
from frontend.output_parsers.reasoning import prompt_opens_reasoning

logger = logging.getLogger("nvllm")


async def render_chat(state: ServerState, engine, messages: list[ChatMessage], plan: ChatPlan,
                      add_generation_prompt: bool) -> tuple[str, list[int]]:
    """The prompt text and its token ids (special tokens come only from the template, never from contents); the
    messages' characters are counted before the template runs, a big text is tokenized off the loop."""
    state.check_chars(sum(len(m.text()) for m in messages), "messages")

    def render() -> tuple[str, list[int]]:
        try:
            return chat_template.render_chat(engine.tokenizer, plan.conversation, add_generation_prompt,
                                             **plan.template_kwargs)
        except Exception as e:  # no template, or the template refused the conversation (jinja raise)
            raise APIError(400, f"messages cannot be rendered with the model's chat template: {e}",
                           param="messages") from None

    size = sum(len(m["content"]) for m in plan.conversation)
    return await offload.run(render, offload.ALWAYS if "tools" in plan.template_kwargs else size)


def chat_logprobs(engine, token_ids: list[int], logprobs: list[dict[int, Logprob]], num_top: int) -> ChatChoiceLogprobs:
    content = []
    for tid, entry in zip(token_ids, logprobs):
        sampled = entry.get(tid)
        token = G.decoded(engine, tid, sampled)
        top = []
        for t, lp in G.top_entries(entry, tid, num_top):
            text = G.decoded(engine, t, lp)
            top.append(ChatTopLogprob(token=text, logprob=lp.logprob, bytes=list(text.encode())))
        content.append(ChatTokenLogprob(token=token, logprob=sampled.logprob if sampled else float("-inf"),
                                        bytes=list(token.encode()), top_logprobs=top))
    return ChatChoiceLogprobs(content=content)


@dataclass
class ChatRun:
    """A chat request checked, rendered and started in the engine: what its answer is read from. The chat
    endpoint and /v1/responses (which translates its body into a chat request) share it."""
    engine: object
    request_id: str
    params: SamplingParams
    prompts: list
    stream: object  # (prompt index, delta RequestOutput), as generation.generate gives them
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
    params, constraint_field = G.sampling_params(body)
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
    request_id = G.new_request_id(id_prefix)
    if body.metadata:
        logger.info("request %s metadata %s", request_id, json.dumps(body.metadata, ensure_ascii=False))
    G.check_sequences([body.messages], params, param="messages")
    ticket = state.admission.admit(params.n)  # 503 when overloaded, before any work
    try:
        text, ids = await render_chat(state, engine, body.messages, plan, body.add_generation_prompt)
        in_reasoning = prompt_opens_reasoning(text)
        params = msgspec.structs.replace(params, structured_outputs=with_constraint_after_reasoning(
            params.structured_outputs or plan.tool_constraint, plan, text, engine.tokenizer))
        prompts = await G.process_prompts(state, engine, request_id, [text], params, param="messages",
                                          cache_salt=body.cache_salt, prompt_token_ids=[ids],
                                          constraint_field=constraint_field, max_tokens_field=body.max_tokens_field,
                                          lora_request=lora)
    except BaseException:
        ticket.release()
        raise
    stream = G.generate(state, engine, prompts, ticket, constraint_field)
    return ChatRun(engine, request_id, params, prompts, stream, (plan.tool_parser, plan.reasoning_parser, in_reasoning),
                   lora, constraint_field)


async def create_chat_completion(state: ServerState, body: ChatCompletionRequest, raw: Request):
    run = await start_chat(state, body)
    engine, request_id, params, prompts, stream, formats, lora = (run.engine, run.request_id, run.params, run.prompts,
                                                                 run.stream, run.formats, run.lora)
    num_top = body.top_logprobs or 0
    if body.stream:
        return StreamingResponse(G.sse_events(_stream(state, engine, body, request_id, prompts, stream, num_top,
                                                      formats, state.response_model(lora)), request_id),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    try:
        choices = await cancel_on_disconnect(raw, G.collect(stream, 1, params.n))
    except ClientDisconnected:
        return Response(status_code=499)  # nobody is listening; the engine request is aborted
    except Exception as e:
        raise G.engine_error(e) from e
    G.check_finished(state, choices)
    result = []
    for c in choices:
        read = read_whole(c.text, *formats)
        message = ChatResponseMessage(content=read.content, reasoning_content=read.reasoning,
                                      tool_calls=read.tool_calls)
        reason = finish_reason(c.finish_reason, bool(read.tool_calls))
        if body.legacy_functions and read.tool_calls:  # answered in the form it was asked in
            message.function_call, reason = read.tool_calls[0].function, legacy_finish_reason(reason)
        result.append(ChatChoice(
            index=c.index, message=message,
            logprobs=chat_logprobs(engine, c.token_ids, c.logprobs, num_top) if body.logprobs else None,
            finish_reason=reason, stop_reason=c.stop_reason))
    scored = G.vllm_prompt_logprobs(body.prompt_logprobs, choices[0].prompt_logprobs)
    return ChatCompletionResponse(id=request_id, model=state.response_model(lora), choices=result,
                                  usage=G.usage(prompts, sum(len(c.token_ids) for c in choices)),
                                  prompt_logprobs=scored)


async def _stream(state: ServerState, engine, body: ChatCompletionRequest, request_id: str, prompts, stream,
                  num_top: int, formats: tuple, model: str):
    completion_tokens = 0
    readers = [ChatOutputReader(*formats) for _ in range(body.n)]

    def chunk(choices: list[ChatStreamChoice], usage=None) -> str:
        return sse(ChatCompletionStreamResponse(id=request_id, model=model, choices=choices, usage=usage))

    for index in range(body.n):
        yield chunk([ChatStreamChoice(index=index, delta=DeltaMessage(role="assistant", content=""))])
    async for _, out in stream:
        choices = []
        for c in out.outputs:
            G.raise_request_error(c)
            completion_tokens += len(c.token_ids)
            logprobs = chat_logprobs(engine, c.token_ids, c.logprobs or [], num_top) if body.logprobs else None
            reader = readers[c.index]
            read = reader.read(c.text, last=c.finish_reason is not None)
            if not reader.plain and not (read.reasoning or read.content or read.tool_calls or logprobs
                                         or c.finish_reason):
                continue  # the parsers hold this piece back (a marker may be starting)
            delta = DeltaMessage(content=read.content, reasoning_content=read.reasoning,
                                 tool_calls=read.tool_calls or None)
            reason = finish_reason(c.finish_reason, reader.called)
            if body.legacy_functions:  # one call, mirrored in OpenAI's deprecated form
                delta.function_call = read.tool_calls[0].function if read.tool_calls else None
                reason = legacy_finish_reason(reason)
            choices.append(ChatStreamChoice(index=c.index, delta=delta, logprobs=logprobs, finish_reason=reason,
                                            stop_reason=c.stop_reason))
        if choices:
            yield chunk(choices)
    if body.include_usage:
        yield chunk([], G.usage(prompts, completion_tokens))
