"""The HTTP server's limits, one field per `nvllm serve` flag; the endpoints and the server's middleware
(frontend/http/limits_middleware.py) apply them."""

from dataclasses import dataclass

MIB = 1024 * 1024


@dataclass(frozen=True)
class HTTPLimits:
    """One field per `nvllm serve` flag; 0 means no limit where the flag's help says so."""
    max_request_body_bytes: int = 8 * MIB
    max_prompt_chars: int = 1_000_000
    max_queued_requests: int = 1024
    max_connections: int = 1024
    request_header_timeout: float = 15.0
    request_body_timeout: float = 30.0  # from the end of the head to the end of the body
    metrics_require_key: bool = False
