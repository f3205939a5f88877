"""POST /v1/responses: OpenAI's Responses API on top of the chat path (serving_chat.start_chat), whole or
streamed as Server-Sent Events (`event: TYPE` + `data: {...}`, no [DONE], as OpenAI sends them).

Stateless: nothing is stored, so GET /v1/responses/{id} is a 404 that says so.
"""

import json
import logging
import time

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from frontend.endpoints.chat.output import ChatOutputReader, read_whole
from frontend.endpoints.chat.start import ChatRun, start_chat
from frontend.endpoints.responses.objects import ResponseObject
from frontend.endpoints.responses.output import (ResponseEvents, finish_status, reasoning_token_count, usage,
                                                 whole_output)
from frontend.endpoints.responses.request import chat_request, responses_error
from frontend.endpoints.responses.schemas import STATELESS, ResponsesRequest, TextConfig
from frontend.endpoints.serving.engine_run import check_finished, collect, engine_error
from frontend.endpoints.serving.errors import APIError
from frontend.endpoints.serving.state import ServerState
from frontend.endpoints.serving.streams import ClientDisconnected, cancel_on_disconnect

logger = logging.getLogger("nvllm")


def not_stored(response_id: str) -> APIError:
    return APIError(404, f"no response {response_id!r}: {STATELESS}", param="response_id", code="not_found")


def _template(body: ResponsesRequest, run: ChatRun, model: str) -> ResponseObject:
    """The response as it starts: the request's settings echoed, no output yet."""
    return ResponseObject(
        id=run.request_id.replace("-", "_", 1), status="in_progress", instructions=body.instructions,
        max_output_tokens=body.max_output_tokens, model=model,
        parallel_tool_calls=True if body.parallel_tool_calls is None else body.parallel_tool_calls,
        reasoning=body.reasoning, temperature=body.temperature, text=body.text or TextConfig(),
        tool_choice=body.tool_choice or ("auto" if body.tools else "none"), tools=body.tools or [],
        top_p=body.top_p, metadata=body.metadata)


async def create_response(state: ServerState, body: ResponsesRequest, raw: Request):
    try:
        run = await start_chat(state, chat_request(body), id_prefix="resp")
    except APIError as e:
        raise responses_error(e) from None
    model = state.response_model(run.lora)
    response = _template(body, run, model)
    if body.stream:
        return StreamingResponse(_events(state, run, response), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    cached = []  # the prefix-cache hits the engine reports (its outputs carry them; the joined choice does not)
    try:
        choice = (await cancel_on_disconnect(raw, collect(_noting_cache(run.stream, cached), 1, 1)))[0]
    except ClientDisconnected:
        return Response(status_code=499)  # nobody is listening; the engine request is aborted
    except Exception as e:
        raise responses_error(engine_error(e)) from e
    try:
        check_finished(state, [choice])
    except APIError as e:
        raise responses_error(e) from None
    read = read_whole(choice.text, *run.formats)
    status, details = finish_status(choice.finish_reason)
    response.status, response.incomplete_details = status, details
    response.output = whole_output(read, status == "incomplete")
    response.usage = usage(len(run.prompts[0].prompt_token_ids), max(cached, default=0), len(choice.token_ids),
                           reasoning_token_count(run.engine.tokenizer, choice.token_ids, bool(read.reasoning)))
    response.completed_at = int(time.time())
    return response


async def _noting_cache(stream, cached: list[int]):
    async for i, out in stream:
        cached.append(out.num_cached_tokens)
        yield i, out


async def _events(state: ServerState, run: ChatRun, response: ResponseObject):
    writer = ResponseEvents(response)
    reader = ChatOutputReader(*run.formats)
    token_ids, cached, finish, reasoned = [], 0, None, False
    try:
        for event in writer.start():
            yield _sse(event)
        async for _, out in run.stream:
            cached = max(cached, out.num_cached_tokens)
            for c in out.outputs:
                check_finished(state, [c])  # a 400 about a field, or the engine's failure: an error event
                token_ids += c.token_ids
                finish = c.finish_reason or finish
                read = reader.read(c.text, last=c.finish_reason is not None)
                reasoned = reasoned or bool(read.reasoning)
                for event in writer.add(read):
                    yield _sse(event)
        used = usage(len(run.prompts[0].prompt_token_ids), cached, len(token_ids),
                     reasoning_token_count(run.engine.tokenizer, token_ids, reasoned))
        for event in writer.finish(finish, used, int(time.time())):
            yield _sse(event)
    except Exception as e:  # the client has its 200 already: an error event ends the stream
        error = responses_error(e if isinstance(e, APIError) else engine_error(e))
        if error.status == 500:
            logger.exception("internal error streaming response %s", run.request_id)
        for event in writer.error(error.code or error.type, error.message, error.param):
            yield _sse(event)


def _sse(event: tuple[str, dict]) -> str:
    kind, data = event
    return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"

