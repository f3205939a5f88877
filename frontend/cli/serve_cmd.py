"""`nvllm serve` and `nvllm frontend` (`nvllm engine-core` is the core's own: engine_core/cli/).

- serve [MODEL]: the HTTP frontend in this process and an engine core child process (ipc://), restarted
  (with a growing delay) when it dies after it was up; one that fails at its first start ends serve.
- frontend --engine ADDR: only the HTTP frontend, on the core at ADDR (it needs no model files:
  the core sends the tokenizer at handshake); --engine again for more cores (least-loaded routing).
CURVE key flags are in common/cli/curve_args.py.
"""

import argparse
import os

from common.cli.arg_types import (DEFAULT_CORE_ADDRESS, add_log_level, non_negative_float, non_negative_int, number,
                                  zmq_address)
from common.cli.curve_args import add_frontend_curve_args
from common.cli.engine_args import add_engine_args, add_tracing_args, engine_args_from

FORMATTER = argparse.ArgumentDefaultsHelpFormatter


def _port(text: str) -> int:
    value = number(int, text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be in [0, 65535], got {value}")
    return value


def _add_http_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("HTTP server")
    g.add_argument("--host", default="0.0.0.0", help="address to listen on")
    g.add_argument("--port", type=_port, default=8000, help="port to listen on (0: any free port)")
    g.add_argument("--api-key", default=argparse.SUPPRESS,
                   help="key clients must send as 'Authorization: Bearer KEY' on /v1/*, /tokenize and "
                        "/detokenize (default: $NVLLM_API_KEY; neither set: no key needed)")
    g.add_argument("--disable-uvicorn-access-log", action="store_true", help="no log line per HTTP request")
    from frontend.endpoints.serving.limits import HTTPLimits  # here, not at the top: only the HTTP commands need it
    d = HTTPLimits()
    g.add_argument("--max-request-body-bytes", type=non_negative_int, default=d.max_request_body_bytes,
                   help="largest request body; a bigger one is a 413, refused from Content-Length before it is "
                        "read (0: no limit)")
    g.add_argument("--max-prompt-chars", type=non_negative_int, default=d.max_prompt_chars,
                   help="most characters in one prompt, all of a chat's messages, or a /tokenize text; more is a "
                        "400 before any tokenizing (0: no limit)")
    g.add_argument("--max-queued-requests", type=non_negative_int, default=d.max_queued_requests,
                   help="sequences that may wait for their first token; while that many wait, new generation "
                        "requests are a 503 with Retry-After (0: no limit)")
    g.add_argument("--max-connections", type=non_negative_int, default=d.max_connections,
                   help="open HTTP connections; a request on one opened beyond them is a 503 and the connection "
                        "closes (0: no limit)")
    g.add_argument("--request-header-timeout", type=non_negative_float, default=d.request_header_timeout,
                   help="seconds a connection may take to send a complete request head (from its opening, or "
                        "from the previous response); then it is closed (0: no limit)")
    g.add_argument("--request-body-timeout", type=non_negative_float, default=d.request_body_timeout,
                   help="seconds a request may take to send its body once its head is in; then it is a 408 and "
                        "the connection closes (0: no limit)")
    g.add_argument("--metrics-require-key", action="store_true",
                   help="with an API key, /metrics needs it too")
    lo = p.add_argument_group("LoRA adapters served by name (docs: serving/lora)")
    lo.add_argument("--lora-modules", nargs="+", default=[], metavar="NAME=PATH", type=_lora_module,
                    help="adapters a request picks by giving NAME as its model: NAME=PATH, or JSON "
                         '\'{"name": NAME, "path": PATH, "base_model_name": BASE}\' (needs --enable-lora on the core)')
    lo.add_argument("--allow-runtime-lora-updating", action="store_true",
                    default=os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "").lower() in ("1", "true"),
                    help="serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (default: "
                         "$VLLM_ALLOW_RUNTIME_LORA_UPDATING)")
    from frontend.http.cors import add_cors_args
    add_cors_args(p)
    c = p.add_argument_group("chat outputs (docs: serving/structured-outputs)")
    c.add_argument("--tool-call-parser", default=None, choices=["hermes", "llama3_json", "generic"],
                   help="format of the model's tool calls (default: chosen from the chat template)")
    c.add_argument("--reasoning-parser", default=None, choices=["qwen3", "deepseek_r1", "none"],
                   help="split <think>...</think> into reasoning_content (default: chosen from the chat template)")
    c.add_argument("--enable-auto-tool-choice", action="store_true",
                   help="accepted for vLLM's command lines; tool_choice auto is always on")


def _lora_module(text: str) -> str:
    from common.lora import parse_lora_module
    try:
        parse_lora_module(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _api_key(ns: argparse.Namespace) -> str | None:
    key = getattr(ns, "api_key", None) or os.environ.get("NVLLM_API_KEY") or None
    return key


def _http_limits(ns: argparse.Namespace):
    from frontend.endpoints.serving.limits import HTTPLimits
    return HTTPLimits(max_request_body_bytes=ns.max_request_body_bytes, max_prompt_chars=ns.max_prompt_chars,
                      max_queued_requests=ns.max_queued_requests, max_connections=ns.max_connections,
                      request_header_timeout=ns.request_header_timeout,
                      request_body_timeout=ns.request_body_timeout, metrics_require_key=ns.metrics_require_key)


def _serve_http(ns: argparse.Namespace, engine_factory, served_model_name: str | None) -> int:
    from frontend.endpoints.serving.chat_options import ChatOptions
    from frontend.http.cors import cors_options_from
    from frontend.endpoints.serving.lora_adapters import LoRAAdapters
    from frontend.http.server import run_server
    loras = LoRAAdapters(ns.lora_modules, ns.allow_runtime_lora_updating)  # ValueError: a malformed --lora-modules
    return run_server(engine_factory, host=ns.host, port=ns.port, api_key=_api_key(ns),
                      served_model_name=served_model_name, log_level=ns.log_level,
                      access_log=not ns.disable_uvicorn_access_log, limits=_http_limits(ns),
                      chat=ChatOptions(ns.tool_call_parser, ns.reasoning_parser), loras=loras,
                      cors=cors_options_from(ns))


def run_serve(ns: argparse.Namespace) -> int:
    from frontend.async_engine.async_llm import AsyncLLM

    args = engine_args_from(ns)
    args.validate()
    os.environ.setdefault("NVLLM_LOG_LEVEL", ns.log_level.upper())  # the core child logs at this level too
    return _serve_http(ns, lambda on_starting: AsyncLLM.create(args, on_starting=on_starting), None)


def run_frontend(ns: argparse.Namespace) -> int:
    from frontend.async_engine.async_llm import AsyncLLM
    from frontend.cli.keys_cmd import frontend_socket_setup

    engines = getattr(ns, "engine", None) or [DEFAULT_CORE_ADDRESS]
    if len(set(engines)) != len(engines):
        raise ValueError(f"--engine names an engine core twice: {' '.join(engines)}")
    socket_setup = frontend_socket_setup(ns, engines)
    endpoint = ns.otlp_traces_endpoint
    if endpoint is not None:
        from common.tracing import check_endpoint
        check_endpoint(endpoint)
    return _serve_http(ns, lambda on_starting: AsyncLLM.create(address=engines, socket_setup=socket_setup,
                                                               on_starting=on_starting,
                                                               otlp_traces_endpoint=endpoint),
                       ns.served_model_name)


def register_serve(sub) -> None:
    p = sub.add_parser("serve", help="serve the OpenAI-compatible API (frontend + engine core child process)",
                       description="Serve MODEL (default: the embedded SmolLM2-135M-Instruct) over an "
                                   "OpenAI-compatible HTTP API.", formatter_class=FORMATTER)
    add_engine_args(p)
    _add_http_args(p)
    add_log_level(p)
    p.set_defaults(func=run_serve)


def register_frontend(sub) -> None:
    p = sub.add_parser("frontend", help="run only the HTTP frontend, on an engine core started elsewhere",
                       formatter_class=FORMATTER)
    p.add_argument("--engine", type=zmq_address, action="append", default=argparse.SUPPRESS, metavar="ADDR",
                   help="ZeroMQ address of the engine core (`nvllm engine-core --listen`); repeat for several cores: "
                        f"each request goes to the least-loaded live one (default: {DEFAULT_CORE_ADDRESS})")
    p.add_argument("--served-model-name", default=None, help="model name the API reports (default: the core's)")
    _add_http_args(p)
    add_tracing_args(p)
    add_frontend_curve_args(p)
    add_log_level(p)
    p.set_defaults(func=run_frontend)
