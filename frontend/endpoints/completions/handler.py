"""POST /v1/completions: prompts as text or token ids, streamed (SSE) or whole.

Choice i x n + j is completion j of prompt i. With `echo` the prompt text comes first, and with `logprobs` its
tokens' logprobs too (the core scores the prompt: SamplingParams.prompt_logprobs), the first token's null as
OpenAI's are. `echo` with `max_tokens: 0` returns the scored prompt alone, which is how evaluation harnesses
(lm-eval's loglikelihood tasks) ask for a continuation's log-likelihood. With `use_beam_search` the
n choices of a prompt are its n best beams, best score first (one engine request per prompt, answered whole).
"""

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from common.errors import InvalidParameter
from frontend.async_engine.async_llm import AsyncLLM
from frontend.endpoints.completions.schemas import (CompletionChoice, CompletionLogprobs, CompletionRequest,
                                                    CompletionResponse, CompletionStreamResponse)
from frontend.endpoints.serving.engine_run import (check_finished, collect, engine_error, generate, raise_request_error,
                                                   sse_events)
from frontend.endpoints.serving.errors import APIError, bad_request
from frontend.endpoints.serving.prompts import check_sequences, process_prompts
from frontend.endpoints.serving.request_params import new_request_id, sampling_params
from frontend.endpoints.serving.request_totals import usage, vllm_prompt_logprobs
from frontend.endpoints.serving.state import ServerState
from frontend.endpoints.serving.streams import ClientDisconnected, cancel_on_disconnect, sse
from frontend.endpoints.serving.token_logprobs import decoded, top_entries
from frontend.request_path.outputs import Logprob
from frontend.request_path.processor import ProcessedRequest


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

    def prompt(self, token_ids: list[int], scored: list[dict[int, Logprob] | None] | None) -> CompletionLogprobs:
        """The echoed prompt's tokens with their logprobs (scored: the core's, the first token's None)."""
        return self.generated(token_ids, scored if scored is not None else [None] * len(token_ids))

    def generated(self, token_ids: list[int], logprobs: list[dict[int, Logprob] | None]) -> CompletionLogprobs:
        out = CompletionLogprobs()
        for tid, entry in zip(token_ids, logprobs):
            if entry is None:
                self._token(out, decoded(self.engine, tid, None), None, None)
                continue
            sampled = entry.get(tid)
            top = {decoded(self.engine, t, lp): lp.logprob for t, lp in top_entries(entry, tid, self.num_top)}
            token = decoded(self.engine, tid, sampled)
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
    engine = state.generating_engine()
    lora = state.check_model(body.model)
    params, constraint_field = sampling_params(body)
    try:
        beam_search = body.beam_search_params()
    except InvalidParameter as e:
        raise bad_request(e) from None
    request_id = new_request_id("cmpl")
    raw_prompts = _prompts(body.prompt)
    check_sequences(raw_prompts, params)
    ticket = state.admission.admit(len(raw_prompts) * params.n)  # 503 when overloaded, before any work
    try:
        prompts = await process_prompts(state, engine, request_id, raw_prompts, params,
                                          cache_salt=body.cache_salt, constraint_field=constraint_field,
                                          beam_search=beam_search, lora_request=lora)
    except BaseException:
        ticket.release()
        raise
    stream = generate(state, engine, prompts, ticket, constraint_field)
    if body.stream:
        return StreamingResponse(sse_events(_stream(state, engine, body, request_id, prompts, stream,
                                                      state.response_model(lora)), request_id),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    try:
        choices = await cancel_on_disconnect(raw, collect(stream, len(prompts), params.n))
    except ClientDisconnected:
        return Response(status_code=499)  # nobody is listening; the engine requests are aborted
    except Exception as e:
        raise engine_error(e) from e
    check_finished(state, choices)
    if body.scores_only:  # the one token the engine computed is not part of the answer
        for choice in choices:
            choice.text, choice.token_ids, choice.logprobs = "", [], []
    result = []
    for choice in choices:
        prompt = prompts[choice.index // params.n]
        text, logprobs = choice.text, None
        if body.logprobs is not None and beam_search is None:  # beams carry no per-token logprobs
            builder = LogprobsBuilder(engine, body.logprobs)
            logprobs = (builder.prompt(prompt.prompt_token_ids, choice.prompt_logprobs) if body.echo
                        else CompletionLogprobs())
            gen = builder.generated(choice.token_ids, choice.logprobs)
            for name in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
                getattr(logprobs, name).extend(getattr(gen, name))
        if body.echo:
            text = _echo_text(engine, prompt) + text
        scored = vllm_prompt_logprobs(body.prompt_logprobs, choice.prompt_logprobs)
        result.append(CompletionChoice(index=choice.index, text=text, logprobs=logprobs, prompt_logprobs=scored,
                                       finish_reason=choice.finish_reason, stop_reason=choice.stop_reason))
    completion_tokens = sum(len(c.token_ids) for c in choices)
    return CompletionResponse(id=request_id, model=state.response_model(lora), choices=result,
                              usage=usage(prompts, completion_tokens))


async def _stream(state: ServerState, engine: AsyncLLM, body: CompletionRequest, request_id: str, prompts, stream,
                  model: str):
    n = body.n
    builders = {}
    scores_sent = set()  # choices whose vLLM prompt_logprobs have gone out
    echoed = set()  # prompts whose echo has gone out: each at its first output, which brings its prompt logprobs
    completion_tokens = 0

    def chunk(choices: list[CompletionChoice], usage=None) -> str:
        return sse(CompletionStreamResponse(id=request_id, model=model, choices=choices, usage=usage))

    def echo(i: int, scored) -> list[CompletionChoice]:
        echoed.add(i)
        choices = []
        for index in range(i * n, (i + 1) * n):
            logprobs = None
            if body.logprobs is not None:
                builders[index] = LogprobsBuilder(engine, body.logprobs)
                logprobs = builders[index].prompt(prompts[i].prompt_token_ids, scored)
            choices.append(CompletionChoice(index=index, text=_echo_text(engine, prompts[i]), logprobs=logprobs,
                                            prompt_logprobs=vllm_prompt_logprobs(body.prompt_logprobs, scored)))
        return choices

    def generated(i: int, out) -> list[CompletionChoice]:
        nonlocal completion_tokens
        choices = []
        for c in out.outputs:
            raise_request_error(c)
            index = i * n + c.index
            if body.scores_only:
                c.text, c.token_ids, c.logprobs = "", [], []
            completion_tokens += len(c.token_ids)
            logprobs = None
            if body.logprobs is not None:
                builder = builders.setdefault(index, LogprobsBuilder(engine, body.logprobs))
                logprobs = builder.generated(c.token_ids, c.logprobs or [])
            scored = None  # without echo, vLLM's prompt_logprobs come with a choice's first chunk that has them
            if not body.echo and index not in scores_sent and out.prompt_logprobs is not None:
                scored = vllm_prompt_logprobs(body.prompt_logprobs, out.prompt_logprobs)
                scores_sent.add(index)
            choices.append(CompletionChoice(index=index, text=c.text, logprobs=logprobs, prompt_logprobs=scored,
                                            finish_reason=c.finish_reason, stop_reason=c.stop_reason))
        return choices

    # the echo goes first, with the prompt's logprobs where asked: a prompt's outputs wait for them (sample 0
    # scores the prompt, and another sample may be faster)
    waits = body.echo and (body.logprobs is not None or body.prompt_logprobs is not None)
    held: dict[int, list] = {}
    async for i, out in stream:
        if body.echo and i not in echoed:
            if waits and out.prompt_logprobs is None and not out.finished:
                held.setdefault(i, []).append(out)
                continue
            choices = echo(i, out.prompt_logprobs)
            for earlier in held.pop(i, []):
                choices += generated(i, earlier)
        else:
            choices = []
        choices += generated(i, out)
        if choices:
            yield chunk(choices)
    if body.include_usage:
        yield chunk([], usage(prompts, completion_tokens))

