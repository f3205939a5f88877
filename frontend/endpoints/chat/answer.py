"""A chat answer's parts: its logprobs as OpenAI shows them, and its stream of chunks.

A stream begins with one {"role": "assistant", "content": ""} delta per choice, then content deltas
token by token; the last delta of a choice carries its finish_reason.
"""

from frontend.endpoints.chat.output import ChatOutputReader, finish_reason, legacy_finish_reason
from frontend.endpoints.chat.schemas import (ChatChoiceLogprobs, ChatCompletionRequest, ChatCompletionStreamResponse,
                                             ChatStreamChoice, ChatTokenLogprob, ChatTopLogprob, DeltaMessage)
from frontend.endpoints.serving.engine_run import raise_request_error
from frontend.endpoints.serving.request_totals import usage
from frontend.endpoints.serving.state import ServerState
from frontend.endpoints.serving.streams import sse
from frontend.endpoints.serving.token_logprobs import decoded, top_entries
from frontend.request_path.outputs import Logprob


def chat_logprobs(engine, token_ids: list[int], logprobs: list[dict[int, Logprob]], num_top: int) -> ChatChoiceLogprobs:
    content = []
    for tid, entry in zip(token_ids, logprobs):
        sampled = entry.get(tid)
        token = decoded(engine, tid, sampled)
        top = []
        for t, lp in top_entries(entry, tid, num_top):
            text = decoded(engine, t, lp)
            top.append(ChatTopLogprob(token=text, logprob=lp.logprob, bytes=list(text.encode())))
        content.append(ChatTokenLogprob(token=token, logprob=sampled.logprob if sampled else float("-inf"),
                                        bytes=list(token.encode()), top_logprobs=top))
    return ChatChoiceLogprobs(content=content)


async def stream_chunks(state: ServerState, engine, body: ChatCompletionRequest, request_id: str, prompts, stream,
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
            raise_request_error(c)
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
        yield chunk([], usage(prompts, completion_tokens))
