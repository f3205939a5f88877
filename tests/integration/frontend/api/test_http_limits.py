"""The HTTP server's limits on a real `nvllm serve` (tiny model): API key before the body, body size,
prompt shapes and characters, non-finite numbers, big tokenizations off the event loop, overload,
the request-head deadline and the connection cap. Every refusal is an OpenAI error naming its flag."""

import json
import socket
import threading
import time

import httpx
import pytest

from tests.support.tiny_models import build_tiny_model
from tests.support.http_helpers import metric, start_serve, wait_until

pytestmark = pytest.mark.integration

KEY = "limits-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
BODY_LIMIT = 3_000_000
CHARS_LIMIT = 2_500_000
# one running sequence at a time, so others wait in the core
ENGINE = ["--kv-cache-memory", "256MiB", "--max-model-len", "4096", "--max-num-seqs", "1"]
WAIT = 120  # the deadline of every wait for something expected within a second or two


@pytest.fixture(scope="module")
def model(tmp_path_factory, default_model_dir):
    """A tiny llama with room for 4096 positions: a request can run long enough to keep others waiting."""
    return build_tiny_model(str(tmp_path_factory.mktemp("tiny4k")), "llama", default_model_dir,
                            max_position_embeddings=4096)


def start(model, tmp_path_factory, name: str, flags: list[str]):
    return start_serve([model, "--api-key", KEY, *ENGINE, *flags], str(tmp_path_factory.mktemp(name) / "serve.log"))


@pytest.fixture(scope="module")
def server(model, tmp_path_factory):
    base, port, proc = start(model, tmp_path_factory, "limits", [
        "--max-request-body-bytes", str(BODY_LIMIT), "--max-prompt-chars", str(CHARS_LIMIT),
        "--max-queued-requests", "2", "--request-header-timeout", "1", "--request-body-timeout", "1",
        "--metrics-require-key",
        "--disable-uvicorn-access-log"])
    yield base, port, proc
    assert proc.stop() == 0, proc.log()[-3000:]


def post(base: str, path: str, body, headers=AUTH, timeout: float = 120) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body, separators=(",", ":")).encode()
    return httpx.post(base + path, content=content, headers={"Content-Type": "application/json", **headers},
                      timeout=timeout)


def error_of(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text[:500]
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def raw_response(sock: socket.socket, timeout: float = WAIT) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of one HTTP/1.1 response read from a raw socket (Content-Length framed)."""
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the server closed the connection without an answer: {data!r}"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    while len(body) < int(headers.get("content-length", 0)):
        chunk = sock.recv(65536)
        assert chunk
        body += chunk
    return int(lines[0].split()[1]), headers, body


def closed_by_server(sock: socket.socket, timeout: float) -> bool:
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=WAIT)


# ---- API key and body size: before the body is read ---------------------------------------------

def test_key_is_checked_before_a_huge_body_is_read(server):
    _, port, _ = server
    for headers, status in ((b"", 401), (b"Authorization: Bearer wrong\r\n", 401)):
        with connect(port) as s:
            # a 24 MB body is announced and none of it is sent: the answer must come anyway
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + headers +
                      b"Content-Length: 24000000\r\n\r\n")
            code, reply_headers, body = raw_response(s)
            assert code == status and json.loads(body)["error"]["code"] == "invalid_api_key"
            assert reply_headers.get("connection") == "close"
            assert closed_by_server(s, WAIT)


def test_body_over_the_limit_is_413_from_content_length(server):
    _, port, _ = server
    with connect(port) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Authorization: Bearer " + KEY.encode() + b"\r\nContent-Length: 24000000\r\n\r\n")
        code, headers, body = raw_response(s)
        assert code == 413 and headers.get("connection") == "close"
        error = json.loads(body)["error"]
        assert error["code"] == "request_too_large" and f"--max-request-body-bytes {BODY_LIMIT}" in error["message"]


def test_chunked_body_is_cut_off_once_past_the_limit(server):
    _, port, _ = server
    with connect(port) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Authorization: Bearer " + KEY.encode() + b"\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = b"a" * 65536
        sent = 0
        try:  # a little past the limit, never the end of the body: the server must not wait for it
            while sent < BODY_LIMIT + 256 * 1024:
                s.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        code, _, body = raw_response(s)
        assert code == 413 and json.loads(body)["error"]["code"] == "request_too_large"


def test_a_body_under_the_limit_is_served(server):
    base = server[0]
    prompt = "word " * 100_000  # 500 kB: under the body limit, then refused for its tokens, not its size
    error = error_of(post(base, "/v1/completions", {"prompt": prompt, "max_tokens": 1}), 400)
    assert error["param"] == "prompt"


def test_metrics_require_key(server):
    base = server[0]
    assert httpx.get(base + "/metrics", timeout=WAIT).status_code == 401
    r = httpx.get(base + "/metrics", headers=AUTH, timeout=WAIT)
    assert r.status_code == 200 and "nvllm:engine_up" in r.text
    assert httpx.get(base + "/health", timeout=WAIT).status_code == 200  # health needs no key


# ---- prompt shapes, characters, token lists, numbers ----------------------------------------------

def test_a_long_bad_prompt_list_is_one_error_naming_the_first_bad_element(server):
    base = server[0]
    start = time.perf_counter()
    error = error_of(post(base, "/v1/completions", {"prompt": [1, 2] + [1.5] * 100_000}), 400)
    assert error["param"] == "prompt" and error["message"].startswith("prompt[2] must be a token id"), error
    assert "1.5" in error["message"] and len(error["message"]) < 200
    for prompt, message in [([[1, 2], [3, -4]], "prompt[1][1] must be a token id"),
                            (["a", 3], "prompt[1] must be a string"),
                            (["a"] * 1025, "prompt is a list of 1025 prompts"),
                            ([True], "prompt[0] must be"),
                            ({"text": "hi"}, "prompt must be a string")]:
        error = error_of(post(base, "/v1/completions", {"prompt": prompt}), 400)
        assert error["param"] == "prompt" and error["message"].startswith(message), error
    for field, value in (("stop", [1.5] * 100_000), ("stop_token_ids", [1.5] * 100_000)):
        error = error_of(post(base, "/v1/completions", {"prompt": "hi", field: value}), 400)
        assert error["param"] == field and "100000 items" in error["message"], error
    error = error_of(post(base, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}] * 5000}), 400)
    assert error["param"] == "messages" and "5000 items" in error["message"]
    assert time.perf_counter() - start < 60
    # the schema still shows the four accepted forms
    spec = httpx.get(base + "/openapi.json", timeout=WAIT).json()["components"]["schemas"]
    assert len(spec["CompletionRequest"]["properties"]["prompt"]["anyOf"]) == 4


@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", {"prompt": "a" * (CHARS_LIMIT + 1)}, "prompt"),
    ("/v1/completions", {"prompt": ["hi", "a" * (CHARS_LIMIT + 1)]}, "prompt"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a" * (CHARS_LIMIT // 2 + 1)}] * 2},
     "messages"),
    ("/tokenize", {"prompt": "a" * (CHARS_LIMIT + 1)}, "prompt"),
    ("/tokenize", {"messages": [{"role": "user", "content": [{"type": "text", "text": "a" * (CHARS_LIMIT + 1)}]}]},
     "messages"),
])
def test_characters_over_the_limit_are_refused_before_tokenizing(server, path, body, param):
    error = error_of(post(server[0], path, body), 400)
    assert error["param"] == param and error["code"] == "prompt_too_long"
    assert f"--max-prompt-chars {CHARS_LIMIT}" in error["message"]


def test_detokenize_token_count_is_capped(server):
    error = error_of(post(server[0], "/detokenize", {"tokens": [1] * ((1 << 20) + 1)}), 400)
    assert error["param"] == "tokens" and "more than 1048576" in error["message"]
    error = error_of(post(server[0], "/detokenize", {"tokens": [1, 2, 0.5]}), 400)
    assert error["message"].startswith("tokens[2] must be a token id")
    assert post(server[0], "/detokenize", {"tokens": [1] * 10_000}).status_code == 200


@pytest.mark.parametrize("path,field,literal", [
    ("/v1/completions", "temperature", "Infinity"), ("/v1/completions", "temperature", "NaN"),
    ("/v1/completions", "top_p", "NaN"), ("/v1/completions", "presence_penalty", "-Infinity"),
    ("/v1/completions", "repetition_penalty", "Infinity"), ("/v1/completions", "min_p", "NaN"),
    ("/v1/chat/completions", "temperature", "Infinity"), ("/v1/chat/completions", "frequency_penalty", "NaN"),
])
def test_non_finite_numbers_are_refused(server, path, field, literal):
    head = '{"prompt": "hi"' if path == "/v1/completions" else '{"messages": [{"role": "user", "content": "hi"}]'
    error = error_of(post(server[0], path, f'{head}, "max_tokens": 1, "{field}": {literal}}}'.encode()), 400)
    assert error["param"] == field and "finite" in error["message"], error


# ---- big tokenizations do not stall the event loop --------------------------------------------------

def test_a_huge_prompt_does_not_stall_other_requests(server):
    base = server[0]
    text = ("The quick brown fox jumps over the lazy dog, again and again. " * 40_000)[:CHARS_LIMIT - 10]
    result = {}

    def big():
        start = time.perf_counter()
        result["response"] = post(base, "/tokenize", {"prompt": text})
        result["seconds"] = time.perf_counter() - start

    worker = threading.Thread(target=big)
    worker.start()
    small = []  # (latency, whether the big request was still running when this one ended)
    with httpx.Client(base_url=base, timeout=120) as client:
        while worker.is_alive():
            start = time.perf_counter()
            assert client.get("/version").status_code == 200
            small.append((time.perf_counter() - start, worker.is_alive()))
            time.sleep(0.02)
    worker.join()
    r = result["response"]
    assert r.status_code == 200 and r.json()["count"] > 300_000, r.text[:300]
    during = [latency for latency, running in small if running]
    # tokenizing ~2.5 M characters takes a second or more; on the event loop it would hold up a
    # small request for most of that time
    assert len(during) >= 5, (small, result["seconds"])
    assert max(during) < result["seconds"] / 3, (max(during), result["seconds"])


# ---- overload -----------------------------------------------------------------------------------------

def test_overload_is_503_with_retry_after_and_nothing_leaks(server):
    base = server[0]
    # requests refused after admission (too many tokens) and one abandoned stream must let go of
    # their places, or the limit of 2 would refuse the waiting requests below
    for _ in range(3):
        assert post(base, "/v1/completions", {"prompt": [5] * 5000, "max_tokens": 1}).status_code == 400
    with httpx.stream("POST", base + "/v1/completions", headers=AUTH, timeout=120,
                      json={"prompt": "hi", "max_tokens": 400, "ignore_eos": True, "stream": True}) as r:
        next(r.iter_lines())
    with httpx.stream("POST", base + "/v1/completions", headers=AUTH, timeout=120,
                      json={"prompt": "hi", "max_tokens": 4000, "ignore_eos": True, "stream": True}) as running:
        assert running.status_code == 200
        lines = running.iter_lines()
        assert next(lines).startswith("data: ")  # it runs: the one slot (--max-num-seqs 1) is taken
        waiting = []
        threads = [threading.Thread(target=lambda: waiting.append(
            post(base, "/v1/completions", {"prompt": "hello", "max_tokens": 2}))) for _ in range(2)]
        for t in threads:
            t.start()
        # both are admitted and wait in the core
        wait_until(lambda: metric(httpx.get(base + "/metrics", headers=AUTH, timeout=WAIT).text,
                                  "nvllm:num_requests_waiting") == 2, WAIT, what="two requests waiting in the core")
        r = post(base, "/v1/completions", {"prompt": "one too many", "max_tokens": 2})
        error = error_of(r, 503)
        assert error["code"] == "server_overloaded" and "--max-queued-requests 2" in error["message"]
        assert r.headers["retry-after"] == "1"
        error = error_of(post(base, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}), 503)
        assert error["code"] == "server_overloaded"
    # closing the stream aborts it: the two waiting requests run, and new ones are served again
    for t in threads:
        t.join(WAIT)
    assert [w.status_code for w in waiting] == [200, 200], [w.text[:200] for w in waiting]
    for _ in range(3):
        assert post(base, "/v1/completions", {"prompt": "hi", "max_tokens": 2}).status_code == 200


# ---- connections --------------------------------------------------------------------------------------

def test_connections_without_a_complete_head_are_closed(server):
    base, port, _ = server
    start = time.perf_counter()  # before the server can accept any of them, so its 1 s ends after start + 1
    slow = [connect(port) for _ in range(20)]
    for s in slow:
        s.sendall(b"POST /v1/compl")  # half a request line, then nothing
    assert httpx.get(base + "/v1/models", headers=AUTH, timeout=WAIT).status_code == 200  # others are served meanwhile
    try:
        assert all(closed_by_server(s, WAIT) for s in slow)
        elapsed = time.perf_counter() - start
        assert elapsed >= 0.95, elapsed  # by the 1 s deadline, not at once
    finally:
        for s in slow:
            s.close()
    # a keep-alive connection that starts its next request and stalls is closed the same way
    with connect(port) as s:
        s.sendall(b"GET /version HTTP/1.1\r\nHost: x\r\n\r\n")
        assert raw_response(s)[0] == 200
        s.sendall(b"GET /vers")
        assert closed_by_server(s, WAIT)


def test_a_trickled_body_is_cut_off_with_408(server):
    """A client that sends its head, then its body a few bytes at a time, is answered 408 and closed
    at the body deadline instead of holding its connection open as long as it likes."""
    base, port, _ = server
    with connect(port) as s:
        body = json.dumps({"prompt": "hi", "max_tokens": 1}).encode()
        start = time.perf_counter()  # before the server has the head, so its 1 s ends after start + 1
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  + f"Authorization: {AUTH['Authorization']}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                  + body[:5])
        status, headers, answer = raw_response(s)
        assert status == 408 and json.loads(answer)["error"]["code"] == "request_timeout"
        assert 0.95 <= time.perf_counter() - start < 60  # at the deadline, not never
        assert closed_by_server(s, WAIT)
    assert httpx.get(base + "/v1/models", headers=AUTH, timeout=WAIT).status_code == 200


@pytest.fixture(scope="module")
def capped_server(model, tmp_path_factory):
    base, port, proc = start(model, tmp_path_factory, "capped", ["--max-connections", "5"])
    yield base, port, proc
    assert proc.stop() == 0, proc.log()[-3000:]


def test_connections_beyond_the_cap_are_503_and_closed(capped_server):
    _, port, proc = capped_server
    request = b"GET /version HTTP/1.1\r\nHost: x\r\n\r\n"
    first = [connect(port) for _ in range(5)]
    try:
        for s in first:
            s.sendall(request)
            assert raw_response(s)[0] == 200  # kept alive: 5 connections open
        for _ in range(3):
            with connect(port) as s:
                s.sendall(request)
                code, headers, body = raw_response(s)
                assert code == 503 and headers.get("connection") == "close" and headers.get("retry-after") == "1"
                error = json.loads(body)["error"]
                assert error["code"] == "too_many_connections" and "--max-connections 5" in error["message"]
                assert closed_by_server(s, WAIT)
        first[0].sendall(request)  # the first ones still work
        assert raw_response(first[0])[0] == 200
    finally:
        for s in first:
            s.close()
    deadline = time.monotonic() + WAIT  # once they are closed, new connections are served
    while True:
        with connect(port) as s:
            s.sendall(request)
            code = raw_response(s)[0]
        if code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert code == 200
    assert "--max-connections 5" in proc.log()


# ---- flags ------------------------------------------------------------------------------------------------

def test_limit_flags_reach_the_server_limits():
    from frontend.cli.main import build_parser
    from frontend.cli.serve_cmd import _http_limits

    for command in (["serve"], ["frontend"]):
        ns = build_parser().parse_args(command + [
            "--max-request-body-bytes", "10", "--max-prompt-chars", "20", "--max-queued-requests", "0",
            "--max-connections", "40", "--request-header-timeout", "2.5", "--metrics-require-key"])
        limits = _http_limits(ns)
        assert (limits.max_request_body_bytes, limits.max_prompt_chars, limits.max_queued_requests,
                limits.max_connections, limits.request_header_timeout, limits.metrics_require_key) == \
            (10, 20, 0, 40, 2.5, True)


@pytest.mark.parametrize("argv", [
    ["serve", "--max-connections", "-1"], ["serve", "--max-request-body-bytes", "1e6"],
    ["frontend", "--request-header-timeout", "inf"], ["frontend", "--max-queued-requests", "x"],
])
def test_bad_limit_flag_is_one_line_and_exit_2(argv, capsys):
    from frontend.cli.main import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "error:" in err, err
