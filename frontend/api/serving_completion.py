"""POST /v1/completions: prompts as text or token ids, streamed (SSE) or whole.

Choice i x n + j is completion j of prompt i. With `echo` the prompt text comes first; the core
does not compute prompt logprobs, so the echoed prompt tokens carry null logprobs.
"""

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from frontend.api import generation as G
from frontend.api.errors import APIError
from frontend.api.protocol import (CompletionChoice, CompletionLogprobs, CompletionRequest, CompletionResponse,
                                   CompletionStreamResponse)
from frontend.api.state import ServerState
from frontend.api.streams import ClientDisconnected, cancel_on_disconnect, sse
from frontend.async_llm import AsyncLLM
from frontend.outputs import Logprob
from frontend.processor import ProcessedRequest


def _prompts(prompt) -> list[str | list[int]]:
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise APIError(400, "prompt must not be empty", param="prompt")
    if isinstance(prompt[0], int):
        return [list(prompt)]
    return list(prompt)


class LogprobsBuilder:
    """OpenAI's completion logprobs (tokens, token_logprobs, top_logprobs, text_offset) for one choice,
    built piece by piece so streamed chunks carry consecutive text offsets."""

    def __init__(self, engine: AsyncLLM, num_top: int, offset: int = 0):
        self.engine = engine
        self.num_top = num_top
        self.offset = offset

    def prompt(self, token_ids: list[int]) -> CompletionLogprobs:
        out = CompletionLogprobs()
        for tid in token_ids:
            self._token(out, G.decoded(self.engine, tid, None), None, None)
        return out

    def generated(self, token_ids: list[int], logprobs: list[dict[int, Logprob]]) -> CompletionLogprobs:
        out = CompletionLogprobs()
        for tid, entry in zip(token_ids, logprobs):
            sampled = entry.get(tid)
            top = {G.decoded(self.engine, t, lp): lp.logprob for t, lp in G.top_entries(entry, tid, self.num_top)}
            token = G.decoded(self.engine, tid, sampled)
            if sampled is not None:
                top.setdefault(token, sampled.logprob)
            self._token(out, token, sampled.logprob if sampled is not None else None, top)
        return out

    def _token(self, out: CompletionLogprobs, token: str, logprob, top) -> None:
        out.tokens.append(token)
        out.token_logprobs.append(logprob)
        out.top_logprobs.append(top)
        out.text_offset.append(self.offset)
        self.offset += len(token)


def _echo_text(engine: AsyncLLM, prompt: ProcessedRequest) -> str:
    return prompt.prompt if prompt.prompt is not None else engine.tokenizer.decode(prompt.prompt_token_ids)


async def create_completion(state: ServerState, body: CompletionRequest, raw: Request):
    engine = state.ready_engine()
    lora = state.check_model(body.model)
    params, constraint_field = G.sampling_params(body)
    request_id = G.new_request_id("cmpl")
    raw_prompts = _prompts(body.prompt)
    G.check_sequences(raw_prompts, params)
    ticket = state.admission.admit(len(raw_prompts) * params.n)  # 503 when overloaded, before any work
    try:
        prompts = await G.process_prompts(state, engine, request_id, raw_prompts, params,
                                          cache_salt=body.cache_salt, constraint_field=constraint_field,
                                          lora_request=lora)
    except BaseException:
        ticket.release()
        raise
    stream = G.generate(state, engine, prompts, ticket, constraint_field)
    if body.stream:
        return StreamingResponse(G.sse_events(_stream(state, engine, body, request_id, prompts, stream,
                                                      state.response_model(lora)), request_id),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    try:
        choices = await cancel_on_disconnect(raw, G.collect(stream, len(prompts), params.n))
    except ClientDisconnected:
        return Response(status_code=499)  # nobody is listening; the engine requests are aborted
    except Exception as e:
        raise G.engine_error(e) from e
    G.check_finished(state, choices)
    result = []
    for choice in choices:
        prompt = prompts[choice.index // params.n]
        text, logprobs = choice.text, None
        if body.logprobs is not None:
            builder = LogprobsBuilder(engine, body.logprobs)
            logprobs = builder.prompt(prompt.prompt_token_ids) if body.echo else CompletionLogprobs()
            gen = builder.generated(choice.token_ids, choice.logprobs)
            for name in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
                getattr(logprobs, name).extend(getattr(gen, name))
        if body.echo:
            text = _echo_text(engine, prompt) + text
        result.append(CompletionChoice(index=choice.index, text=text, logprobs=logprobs,
                                       finish_reason=choice.finish_reason, stop_reason=choice.stop_reason))
    completion_tokens = sum(len(c.token_ids) for c in choices)
    return CompletionResponse(id=request_id, model=state.response_model(lora), choices=result,
                              usage=G.usage(prompts, completion_tokens))


async def _stream(state: ServerState, engine: AsyncLLM, body: CompletionRequest, request_id: str, prompts, stream,
                  model: str):
    n = body.n
    builders = {}
    completion_tokens = 0

    def chunk(choices: list[CompletionChoice], usage=None) -> str:
        return sse(CompletionStreamResponse(id=request_id, model=model, choices=choices, usage=usage))

    if body.echo:
        for index in range(len(prompts) * n):
            prompt = prompts[index // n]
            text = _echo_text(engine, prompt)
            logprobs = None
            if body.logprobs is not None:
                builders[index] = LogprobsBuilder(engine, body.logprobs)
                logprobs = builders[index].prompt(prompt.prompt_token_ids)
            yield chunk([CompletionChoice(index=index, text=text, logprobs=logprobs)])
    async for i, out in stream:
        choices = []
        for c in out.outputs:
            G.raise_request_error(c)
            index = i * n + c.index
            completion_tokens += len(c.token_ids)
            logprobs = None
            if body.logprobs is not None:
                builder = builders.setdefault(index, LogprobsBuilder(engine, body.logprobs))
                logprobs = builder.generated(c.token_ids, c.logprobs or [])
            choices.append(CompletionChoice(index=index, text=c.text, logprobs=logprobs,
                                            finish_reason=c.finish_reason, stop_reason=c.stop_reason))
        if choices:
            yield chunk(choices)
    if body.include_usage:
        yield chunk([], G.usage(prompts, completion_tokens))
