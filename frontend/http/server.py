"""Running the app on uvicorn: bind first (a busy port fails before any model loads), serve,
and on SIGINT/SIGTERM stop accepting, let streams end (5 s at most), then stop the engine."""

import asyncio
import logging
import signal
import socket
from typing import Awaitable, Callable

import uvicorn

from common.heap import freeze_startup_heap
from frontend.endpoints.serving.chat_options import ChatOptions
from frontend.endpoints.serving.limits import HTTPLimits
from frontend.http.app import build_app
from frontend.http.connections import protocol_class

logger = logging.getLogger("nvllm")

GRACEFUL_SHUTDOWN_SECONDS = 5


def bind(host: str, port: int) -> socket.socket:
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as e:
        raise ValueError(f"--host {host!r} is not an address this machine can listen on: {e}") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        raise ValueError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock


def run_server(engine_factory: Callable[[Callable], Awaitable], *, host: str, port: int, api_key: str | None,
               served_model_name: str | None, log_level: str = "info", access_log: bool = True,
               limits: HTTPLimits | None = None, chat: ChatOptions | None = None, loras=None,
               cors=None) -> int:
    """Serves until SIGINT/SIGTERM; returns the exit code (1 when the engine failed to start)."""
    sock = bind(host, port)
    url = f"http://{host if ':' not in host else f'[{host}]'}:{sock.getsockname()[1]}"
    failures: list[BaseException] = []
    server: uvicorn.Server | None = None

    def on_ready(state) -> None:
        # a server process, unlike a library caller, keeps its startup heap (imports, tokenizer) for good: out of
        # the garbage collector's walks from here on, so small per-request objects (tracing spans) stay cheap
        freeze_startup_heap()
        info = state.engine.model_info
        logger.info("nvllm ready: serving %r (%s, max_model_len %d, KV cache %d tokens in %d blocks) at %s",
                    state.model_name, info.dtype or "dtype unknown", info.max_model_len,
                    info.num_gpu_blocks * info.block_size, info.num_gpu_blocks, url)

    def on_failure(error: BaseException) -> None:
        failures.append(error)
        server.should_exit = True

    limits = limits or HTTPLimits()
    app = build_app(engine_factory, api_key=api_key, served_model_name=served_model_name,
                    on_ready=on_ready, on_failure=on_failure, limits=limits, chat=chat, loras=loras, cors=cors)
    # h11, named explicitly: the connection limits are a subclass of uvicorn's h11 protocol
    config = uvicorn.Config(app, log_config=None, log_level=log_level, access_log=access_log,
                            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS, http=protocol_class(limits))
    server = uvicorn.Server(config)
    logger.info("nvllm HTTP server listening on %s (API key %s); starting the engine", url,
                "required" if api_key else "not required")
    # uvicorn re-raises the signal that stopped it once it is done; after a clean shutdown, SIGTERM
    # should not turn into a kill (exit code -15): take it as an ordinary exit
    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        asyncio.run(server.serve(sockets=[sock]))
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 1 if failures else 0
