"""Cross-origin access for browser pages (`--allowed-origins` and friends, vLLM's flags).

No origins: no CORS middleware at all, so a browser on another origin gets no Access-Control-* headers and
refuses the response. With origins, Starlette's CORSMiddleware answers preflights and tags responses; it sits
outside the key and size checks, so a preflight (which carries no credentials) is never a 401.
"""

import argparse
import json
from dataclasses import dataclass, field


@dataclass(frozen=True)
class CORSOptions:
    allowed_origins: list[str] = field(default_factory=list)  # empty: no cross-origin access
    allowed_methods: list[str] = field(default_factory=lambda: ["*"])
    allowed_headers: list[str] = field(default_factory=lambda: ["*"])
    allow_credentials: bool = False

    @property
    def enabled(self) -> bool:
        return bool(self.allowed_origins)

    def install(self, app) -> None:
        """Adds the middleware when origins are allowed; call it after every other add_middleware (the last
        added runs first)."""
        if not self.enabled:
            return
        from starlette.middleware.cors import CORSMiddleware
        app.add_middleware(CORSMiddleware, allow_origins=self.allowed_origins, allow_methods=self.allowed_methods,
                           allow_headers=self.allowed_headers, allow_credentials=self.allow_credentials)


def json_string_list(text: str) -> list[str]:
    """A flag type: a JSON list of strings, as vLLM takes them ('["https://app.example.com"]')."""
    try:
        value = json.loads(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a JSON list of strings, such as '[\"*\"]', got {text!r}") from None
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise argparse.ArgumentTypeError(f"must be a JSON list of strings, such as '[\"*\"]', got {text!r}")
    return value


def add_cors_args(p: argparse.ArgumentParser) -> None:
    d = CORSOptions()
    g = p.add_argument_group("cross-origin access from browser pages (docs: deployment/security)")
    g.add_argument("--allowed-origins", type=json_string_list, default=d.allowed_origins,
                   help='origins whose pages may call the API, as a JSON list (\'["https://app.example.com"]\', '
                        "'[\"*\"]' for any); default: none, no cross-origin access")
    g.add_argument("--allowed-methods", type=json_string_list, default=d.allowed_methods,
                   help="HTTP methods those pages may use, as a JSON list")
    g.add_argument("--allowed-headers", type=json_string_list, default=d.allowed_headers,
                   help="request headers those pages may send, as a JSON list")
    g.add_argument("--allow-credentials", action="store_true",
                   help="let those pages send cookies and Authorization (answers with the page's own origin)")


def cors_options_from(ns: argparse.Namespace) -> CORSOptions:
    return CORSOptions(ns.allowed_origins, ns.allowed_methods, ns.allowed_headers, ns.allow_credentials)
