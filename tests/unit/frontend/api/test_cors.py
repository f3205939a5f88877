"""CORS: no cross-origin access by default; --allowed-origins lets the named pages in, through Starlette's
middleware, ahead of the API key check (a preflight carries no key)."""

import asyncio

import pytest
from starlette.testclient import TestClient

from frontend.http.app import build_app
from frontend.http.cors import cors_options_from
from frontend.cli.main import build_parser

pytestmark = pytest.mark.unit

APP_PAGE = "https://app.example.com"
OTHER_PAGE = "https://evil.example.net"


async def never_ready(on_starting):
    await asyncio.Event().wait()


def client_for(*flags: str, api_key: str | None = None) -> TestClient:
    ns = build_parser().parse_args(["serve", *flags])
    return TestClient(build_app(never_ready, api_key=api_key, cors=cors_options_from(ns)))


def preflight(client: TestClient, origin: str, method: str = "POST", headers: str = "content-type,authorization"):
    return client.options("/v1/chat/completions", headers={
        "Origin": origin, "Access-Control-Request-Method": method, "Access-Control-Request-Headers": headers})


def test_default_allows_no_origin():
    with client_for() as client:
        reply = preflight(client, APP_PAGE)
        assert "access-control-allow-origin" not in reply.headers
        assert reply.status_code == 405  # no middleware: OPTIONS is an unknown method on the route
        reply = client.get("/health", headers={"Origin": APP_PAGE})
        assert "access-control-allow-origin" not in reply.headers


def test_preflight_from_allowed_origin_gets_the_headers_and_another_does_not():
    with client_for("--allowed-origins", f'["{APP_PAGE}"]', "--allowed-methods", '["GET", "POST"]',
                    "--allowed-headers", '["Content-Type", "Authorization"]', api_key="sk-secret") as client:
        reply = preflight(client, APP_PAGE)
        assert reply.status_code == 200  # not a 401: the preflight never reaches the key check
        assert reply.headers["access-control-allow-origin"] == APP_PAGE
        assert set(reply.headers["access-control-allow-methods"].replace(" ", "").split(",")) >= {"GET", "POST"}
        assert "authorization" in reply.headers["access-control-allow-headers"].lower()
        assert "access-control-allow-credentials" not in reply.headers

        refused = preflight(client, OTHER_PAGE)
        assert refused.status_code == 400
        assert "access-control-allow-origin" not in refused.headers
        assert preflight(client, APP_PAGE, method="DELETE").status_code == 400  # not an allowed method

        # the real request: tagged for the allowed page (a 401 here, since the key is missing), not for the other
        reply = client.post("/v1/chat/completions", json={}, headers={"Origin": APP_PAGE})
        assert reply.status_code == 401 and reply.headers["access-control-allow-origin"] == APP_PAGE
        reply = client.post("/v1/chat/completions", json={}, headers={"Origin": OTHER_PAGE})
        assert "access-control-allow-origin" not in reply.headers


def test_any_origin_with_credentials_answers_with_the_pages_own_origin():
    with client_for("--allowed-origins", '["*"]', "--allow-credentials") as client:
        reply = preflight(client, OTHER_PAGE)
        assert reply.status_code == 200
        # a browser refuses '*' on a request with credentials: the page's origin comes back instead
        assert reply.headers["access-control-allow-origin"] == OTHER_PAGE
        assert reply.headers["access-control-allow-credentials"] == "true"


@pytest.mark.parametrize("value", ['"https://a.example.com"', "[1, 2]", "not json", '{"a": 1}'])
def test_a_flag_that_is_not_a_json_list_of_strings_is_a_one_line_error(value, capsys):
    with pytest.raises(SystemExit) as exit:
        build_parser().parse_args(["serve", "--allowed-origins", value])
    assert exit.value.code == 2
    error = capsys.readouterr().err
    assert "--allowed-origins" in error and "JSON list of strings" in error
