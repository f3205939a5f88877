"""The FastAPI app around an AsyncLLM.

`build_app(engine_factory, ...)`: the lifespan starts the engine in the background (so /health can
answer 503 while the core loads or is unreachable) and shuts it down with the server. Endpoints
that need the engine answer 503 until it is READY and after it dies.
"""

import asyncio
import logging
import os
from contextlib import asynccontextmanager
from importlib import metadata
from typing import Awaitable, Callable

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import PlainTextResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from common.start_failure import EngineStartError
from frontend.async_engine.async_llm import AsyncLLM
from frontend.endpoints.chat import handler as chat_handler
from frontend.endpoints.chat.schemas import ChatCompletionRequest, ChatCompletionResponse
from frontend.endpoints.completions import handler as completions_handler
from frontend.endpoints.completions.schemas import CompletionRequest, CompletionResponse
from frontend.endpoints.embeddings import handler as embeddings_handler
from frontend.endpoints.embeddings.schemas import EmbeddingRequest, EmbeddingResponse
from frontend.endpoints.openai_schemas.answer_fields import ErrorResponse
from frontend.endpoints.responses import handler as responses_handler
from frontend.endpoints.responses.objects import ResponseObject
from frontend.endpoints.responses.schemas import ResponsesRequest
from frontend.endpoints.serving.chat_options import ChatOptions
from frontend.endpoints.serving.errors import engine_unavailable, install_error_handlers
from frontend.endpoints.serving.limits import HTTPLimits
from frontend.endpoints.serving.lora_adapters import LoRAAdapters
from frontend.endpoints.serving.metrics import CONTENT_TYPE
from frontend.endpoints.serving.state import ServerState
from frontend.endpoints.tokenize import handler as tokenize_handler
from frontend.endpoints.tokenize.schemas import DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse
from frontend.http.cors import CORSOptions
from frontend.http.limits_middleware import LimitsMiddleware, key_error
from frontend.http.schemas import (HealthResponse, LoadLoRAAdapterRequest, ModelCard, ModelList,
                                   UnloadLoRAAdapterRequest, VersionResponse)
from frontend.http.trace_context import TraceContextMiddleware

logger = logging.getLogger("nvllm")

_bearer = HTTPBearer(auto_error=False, description="the server's --api-key, when it has one")

ERRORS = {status: {"model": ErrorResponse, "description": why} for status, why in [
    (400, "an invalid parameter (`error.param` names it) or malformed JSON"),
    (401, "missing or wrong API key"),
    (404, "unknown model"),
    (413, "the request body is over --max-request-body-bytes"),
    (503, "the engine core is not ready or is dead, or the server is overloaded (--max-queued-requests)"),
]}
STREAM = {200: {"content": {"text/event-stream": {"schema": {
    "type": "string", "description": "with stream=true: `data: {chunk}` events, then `data: [DONE]`"}}}}}


def version() -> str:
    try:
        return metadata.version("nvllm")
    except metadata.PackageNotFoundError:  # running from a source tree
        import tomllib
        path = os.path.join(os.path.dirname(__file__), "..", "..", "pyproject.toml")
        try:
            with open(path, "rb") as f:
                return tomllib.load(f)["project"]["version"]
        except (OSError, KeyError, ValueError):
            return "unknown"


def build_app(engine_factory: Callable[[Callable[[AsyncLLM], None]], Awaitable[AsyncLLM]], *,
              api_key: str | None = None,
              served_model_name: str | None = None, on_ready: Callable | None = None,
              on_failure: Callable[[BaseException], None] | None = None,
              limits: HTTPLimits | None = None, chat: ChatOptions | None = None,
              loras: LoRAAdapters | None = None, cors: CORSOptions | None = None) -> FastAPI:
    """engine_factory(on_starting): awaitable AsyncLLM (e.g. `lambda on_starting: AsyncLLM.create(args,
    on_starting=on_starting)`); the engine it hands to on_starting before it is READY tells /health why
    it is still waiting."""
    state = ServerState(served_model_name, api_key, limits, chat, loras)

    async def start_engine() -> None:
        try:
            engine = await engine_factory(state.engine_starting)
        except asyncio.CancelledError:
            raise
        except BaseException as e:
            why = e.why if isinstance(e, EngineStartError) else str(e)
            state.startup_error = f"it failed to start: {why}"
            logger.error("the engine core failed to start: %s", why)
            if on_failure is not None:
                on_failure(e)
            return
        try:  # --lora-modules: each adapter read and checked before the server says it is ready
            await state.loras.load_static(engine)
        except (ValueError, RuntimeError, TimeoutError) as e:
            state.startup_error = f"--lora-modules: {e}"
            logger.error("%s", state.startup_error)
            engine.shutdown()
            if on_failure is not None:
                on_failure(e)
            return
        state.engine = engine
        collector = state.metrics.engine
        collector.engine_up = True
        collector.stats = engine.stats
        engine.stats_listeners.append(lambda stats: setattr(collector, "stats", stats))
        if on_ready is not None:
            on_ready(state)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        starter = asyncio.create_task(start_engine(), name="nvllm-engine-start")
        try:
            yield
        finally:
            starter.cancel()
            try:
                await starter
            except BaseException:
                pass
            if state.engine is not None:
                logger.info("shutting down the engine")
                state.engine.shutdown()

    app = FastAPI(title="nvllm", version=version(), lifespan=lifespan,
                  description="OpenAI-compatible API of the nvllm serving engine")
    app.state.nvllm = state
    install_error_handlers(app)
    # the key and the body size are checked here, before FastAPI reads or parses a body
    app.add_middleware(LimitsMiddleware, limits=state.limits, api_key=api_key)
    app.add_middleware(TraceContextMiddleware, state=state)  # a traceparent header continues the caller's trace
    (cors or CORSOptions()).install(app)  # outermost: preflights are answered before the key check

    def require_api_key(request: Request, creds: HTTPAuthorizationCredentials | None = Depends(_bearer)) -> None:
        # LimitsMiddleware has already refused a bad key; this declares the scheme in /openapi.json
        error = key_error(request.headers.get("authorization"), state.api_key)
        if error is not None:
            raise error

    api = APIRouter(dependencies=[Depends(require_api_key)], responses=ERRORS)

    @api.post("/v1/completions", response_model=CompletionResponse, responses=STREAM)
    async def completions(body: CompletionRequest, request: Request):
        return await completions_handler.create_completion(state, body, request)

    @api.post("/v1/chat/completions", response_model=ChatCompletionResponse, responses=STREAM)
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        return await chat_handler.create_chat_completion(state, body, request)

    @api.post("/v1/responses", response_model=ResponseObject, responses=STREAM)
    async def responses(body: ResponsesRequest, request: Request):
        return await responses_handler.create_response(state, body, request)

    @api.get("/v1/responses/{response_id}")
    async def get_response(response_id: str):
        """Always a 404: /v1/responses stores nothing."""
        raise responses_handler.not_stored(response_id)

    @api.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str):
        """Always a 404: /v1/responses stores nothing."""
        raise responses_handler.not_stored(response_id)

    @api.post("/v1/embeddings", response_model=EmbeddingResponse)
    async def embeddings(body: EmbeddingRequest, request: Request):
        return await embeddings_handler.create_embedding(state, body, request)

    @api.get("/v1/models", response_model=ModelList)
    async def models():
        engine = state.ready_engine()
        base, max_len = state.model_name, engine.model_info.max_model_len
        cards = [ModelCard(id=base, max_model_len=max_len, root=base)]
        cards += [ModelCard(id=lora.lora_name, max_model_len=max_len, root=lora.lora_path, parent=base)
                  for lora in state.loras]
        return ModelList(data=cards)

    if state.loras.allow_runtime_updates:  # as vLLM: without the switch the endpoints do not exist (404)
        @api.post("/v1/load_lora_adapter", response_class=PlainTextResponse)
        async def load_lora_adapter(body: LoadLoRAAdapterRequest):
            lora = await state.loras.load(state.ready_engine(), body.lora_name, body.lora_path, body.load_inplace)
            logger.info("loaded LoRA adapter %r from %s", lora.lora_name, lora.lora_path)
            return f"Success: LoRA adapter '{lora.lora_name}' added successfully."

        @api.post("/v1/unload_lora_adapter", response_class=PlainTextResponse)
        async def unload_lora_adapter(body: UnloadLoRAAdapterRequest):
            await state.loras.unload(state.ready_engine(), body.lora_name)
            logger.info("unloaded LoRA adapter %r", body.lora_name)
            return f"Success: LoRA adapter '{body.lora_name}' removed successfully."

    @api.post("/tokenize", response_model=TokenizeResponse)
    async def tokenize(body: TokenizeRequest):
        return await tokenize_handler.tokenize(state, body)

    @api.post("/detokenize", response_model=DetokenizeResponse)
    async def detokenize(body: DetokenizeRequest):
        return await tokenize_handler.detokenize(state, body)

    app.include_router(api)

    @app.get("/health", response_model=HealthResponse, responses={503: ERRORS[503]})
    async def health():
        """200 only when the engine core answers a ping."""
        engine = state.ready_engine()
        try:
            await engine.check_health()
        except Exception as e:
            raise engine_unavailable(str(e) or type(e).__name__) from None
        return HealthResponse()

    @app.get("/version", response_model=VersionResponse)
    async def get_version():
        return VersionResponse(version=version())

    metrics_deps = [Depends(require_api_key)] if state.limits.metrics_require_key else []

    @app.get("/metrics", response_class=Response, responses={200: {"content": {CONTENT_TYPE: {}}}},
             dependencies=metrics_deps)
    async def metrics():
        """Prometheus text format; the engine's figures are fetched fresh from the core (with
        --metrics-require-key, only for clients with the API key)."""
        engine = state.engine
        collector = state.metrics.engine
        collector.engine_up = engine is not None and engine.dead is None
        collector.frontend_requests = engine.num_unfinished_requests if engine is not None else 0
        if collector.engine_up:
            try:
                collector.stats = await asyncio.wait_for(engine.get_stats(), 2.0)
            except Exception:  # a slow or dying core: export the last figures it sent
                collector.stats = engine.stats
        return Response(state.metrics.render(), media_type=CONTENT_TYPE)

    return app
