"""POST /v1/chat/completions: messages rendered with the model's chat template, streamed or whole.

The request walks down this package: started (start.py: planned in plan.py, rendered in render.py, constrained
in constraint.py, handed to the engine through ../serving), then answered whole here or streamed (answer.py),
its text read for reasoning and tool calls (output.py).
"""

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from frontend.endpoints.chat.answer import chat_logprobs, stream_chunks
from frontend.endpoints.chat.output import finish_reason, legacy_finish_reason, read_whole
from frontend.endpoints.chat.schemas import (ChatChoice, ChatCompletionRequest, ChatCompletionResponse,
                                             ChatResponseMessage)
from frontend.endpoints.chat.start import start_chat
from frontend.endpoints.serving.engine_run import check_finished, collect, engine_error, sse_events
from frontend.endpoints.serving.request_totals import usage, vllm_prompt_logprobs
from frontend.endpoints.serving.state import ServerState
from frontend.endpoints.serving.streams import ClientDisconnected, cancel_on_disconnect


async def create_chat_completion(state: ServerState, body: ChatCompletionRequest, raw: Request):
    run = await start_chat(state, body)
    engine, request_id, params, prompts, stream, formats, lora = (run.engine, run.request_id, run.params, run.prompts,
                                                                 run.stream, run.formats, run.lora)
    num_top = body.top_logprobs or 0
    if body.stream:
        return StreamingResponse(sse_events(stream_chunks(state, engine, body, request_id, prompts, stream, num_top,
                                                      formats, state.response_model(lora)), request_id),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    try:
        choices = await cancel_on_disconnect(raw, collect(stream, 1, params.n))
    except ClientDisconnected:
        return Response(status_code=499)  # nobody is listening; the engine request is aborted
    except Exception as e:
        raise engine_error(e) from e
    check_finished(state, choices)
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
    scored = vllm_prompt_logprobs(body.prompt_logprobs, choices[0].prompt_logprobs)
    return ChatCompletionResponse(id=request_id, model=state.response_model(lora), choices=result,
                                  usage=usage(prompts, sum(len(c.token_ids) for c in choices)),
                                  prompt_logprobs=scored)
