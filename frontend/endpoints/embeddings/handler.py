"""POST /v1/embeddings on a `--runner pooling` engine: each input is one embedding request (its prompt computed,
its final hidden states pooled), answered whole. `encoding_format` base64 sends the float32 little-endian bytes
as the core made them, which is what the openai client decodes.
"""

import base64
import struct
import time

from fastapi import Request
from fastapi.responses import Response

from common.errors import InvalidParameter
from common.pooling_params import PoolingParams
from common.request_ids import part_id
from common.validation import NOT_POOLING
from frontend.async_engine.async_llm import AsyncLLM
from frontend.endpoints.embeddings.schemas import EmbeddingData, EmbeddingRequest, EmbeddingResponse, EmbeddingUsage
from frontend.endpoints.serving import offload
from frontend.endpoints.serving.engine_run import engine_error
from frontend.endpoints.serving.errors import APIError, engine_unavailable
from frontend.endpoints.serving.request_params import new_request_id
from frontend.endpoints.serving.state import ServerState
from frontend.endpoints.serving.streams import ClientDisconnected, cancel_on_disconnect, merge
from frontend.request_path.processor import ProcessedRequest


def _inputs(value) -> list[str | list[int]]:
    if isinstance(value, str):
        return [value]
    if not value:
        raise APIError(400, "input must not be empty", param="input")
    return [list(value)] if isinstance(value[0], int) else list(value)


def _input_error(e: InvalidParameter) -> APIError:
    """The engine's check calls the text `prompt`; this endpoint calls it `input`."""
    if e.param != "prompt":
        return APIError(400, str(e), param=e.param)
    message = str(e)
    return APIError(400, "input" + message[len("prompt"):] if message.startswith("prompt") else message,
                    param="input")


async def _process(state: ServerState, engine: AsyncLLM, request_id: str, inputs: list,
                   params: PoolingParams, lora) -> list[ProcessedRequest]:
    for text in inputs:
        if isinstance(text, str):
            state.check_chars(len(text), "input")

    def work() -> list[ProcessedRequest]:
        processed = []
        for i, prompt in enumerate(inputs):
            rid = request_id if len(inputs) == 1 else part_id(request_id, i)
            try:
                processed.append(engine.process_embedding(rid, prompt, params, lora))
            except InvalidParameter as e:
                raise _input_error(e) from None
        return processed

    return await offload.run(work, sum(len(p) for p in inputs))


async def _run(engine: AsyncLLM, requests: list[ProcessedRequest]) -> list:
    """Each request's final EmbeddingRequestOutput, in input order."""
    results = [None] * len(requests)
    async for i, out in merge([engine.stream(r) for r in requests]):
        results[i] = out
    return results


def _encode(data: bytes, encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(data).decode("ascii")
    return list(struct.unpack(f"<{len(data) // 4}f", data))


async def create_embedding(state: ServerState, body: EmbeddingRequest, raw: Request):
    engine = state.ready_engine()
    lora = state.check_model(body.model)
    if engine.limits.runner != "pooling":
        raise APIError(400, NOT_POOLING, param="model")
    inputs = _inputs(body.input)
    start = time.perf_counter()
    ticket = state.admission.admit(len(inputs))  # 503 when overloaded, before any work
    try:
        request_id = new_request_id("embd")
        requests = await _process(state, engine, request_id, inputs, PoolingParams(dimensions=body.dimensions), lora)
        try:
            outputs = await cancel_on_disconnect(raw, _run(engine, requests))
        except ClientDisconnected:
            return Response(status_code=499)  # nobody is listening; the engine requests are aborted
        except Exception as e:
            raise engine_error(e) from e
    finally:
        ticket.release()
    for out in outputs:
        if out is None or out.error is not None:
            if engine.dead is not None:
                raise engine_unavailable(str(engine.dead))
            raise APIError(500, f"the engine failed this request: {out.error if out is not None else 'no output'}")
    data = [EmbeddingData(index=i, embedding=_encode(out.outputs.data, body.encoding_format))
            for i, out in enumerate(outputs)]
    prompt_tokens = sum(len(r.prompt_token_ids) for r in requests)
    state.metrics.prompt_tokens.inc(prompt_tokens)
    state.metrics.request_success.labels(finished_reason="stop").inc(len(requests))
    state.metrics.e2e.observe(time.perf_counter() - start)
    return EmbeddingResponse(data=data, model=state.response_model(lora),
                             usage=EmbeddingUsage(prompt_tokens=prompt_tokens, total_tokens=prompt_tokens))
