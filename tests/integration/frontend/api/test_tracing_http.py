"""Tracing as served: `nvllm serve --otlp-traces-endpoint` on a tiny model exports over OTLP/HTTP
(OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf) to a real receiver process (tests/support/otlp_receiver.py). A
request sent through the openai client with a caller's traceparent gives the frontend span (the caller's span its
parent) and the engine core's child span; once the receiver is gone, requests are still served and the server says so
once in its log."""

import os
import signal
import subprocess
import sys

import httpx
import pytest

from tests.support.http_helpers import openai_client, start_serve, wait_until
from tests.support.paths import ROOT

pytestmark = pytest.mark.integration

CALLER_TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN_ID = "b7ad6b7169203331"


@pytest.fixture(scope="module")
def receiver():
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "tests", "support", "otlp_receiver.py")],
                            stdout=subprocess.PIPE, text=True)
    port = int(proc.stdout.readline())
    yield proc, f"http://127.0.0.1:{port}"
    proc.kill()
    proc.wait()


@pytest.fixture(scope="module")
def server(tiny_models, receiver, tmp_path_factory):
    env = {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf", "OTEL_BSP_SCHEDULE_DELAY": "100",
           "OTEL_SERVICE_NAME": ""}
    log = str(tmp_path_factory.mktemp("serve") / "serve.log")
    base, _, proc = start_serve([tiny_models["llama"], "--dtype", "float32", "--kv-cache-memory", "64MiB",
                                 "--max-model-len", "256", "--disable-uvicorn-access-log",
                                 "--otlp-traces-endpoint", receiver[1]], log, env=env)
    yield base, proc
    # a dead collector must not hold up a clean stop either
    assert proc.stop(signal.SIGTERM) == 0, proc.log()[-3000:]


def received(url: str) -> list[dict]:
    return httpx.get(url + "/spans", timeout=30).json()


def test_the_receiver_gets_the_request_span_under_the_callers_and_the_core_span_under_it(server, receiver):
    client = openai_client(server[0])
    out = client.completions.create(model=client.models.list().data[0].id, prompt="Hello", max_tokens=4,
                                    temperature=0.5, extra_body={"ignore_eos": True},
                                    extra_headers={"traceparent": f"00-{CALLER_TRACE_ID}-{CALLER_SPAN_ID}-01"})
    assert out.usage.completion_tokens == 4

    def pair():
        spans = [s for s in received(receiver[1]) if s["trace_id"] == CALLER_TRACE_ID]
        front = [s for s in spans if s["name"] == "llm_request"]
        core = [s for s in spans if s["name"] == "llm_core"]
        return (front, core) if front and core else None

    (front,), (core,) = wait_until(pair, what="the request's two spans at the receiver")
    assert front["path"] == "/v1/traces"  # an endpoint given without a path posts to OTLP's
    assert front["service"] == "nvllm-frontend" and core["service"] == "nvllm-engine-core"
    assert front["parent_span_id"] == CALLER_SPAN_ID
    assert core["parent_span_id"] == front["span_id"]
    a = front["attributes"]
    assert a["gen_ai.request.id"] == out.id
    assert a["gen_ai.response.model"] == out.model
    assert (a["gen_ai.usage.prompt_tokens"], a["gen_ai.usage.completion_tokens"]) == (out.usage.prompt_tokens, 4)
    assert (a["gen_ai.request.max_tokens"], a["gen_ai.request.n"]) == (4, 1)
    assert a["gen_ai.request.temperature"] == pytest.approx(0.5)
    assert a["gen_ai.response.finish_reasons"] == ["length"]
    assert 0 <= a["gen_ai.latency.time_in_queue"] <= a["gen_ai.latency.time_to_first_token"] <= a["gen_ai.latency.e2e"]
    assert core["events"][:2] == ["scheduled", "prefilled"]


def test_without_a_traceparent_the_request_span_starts_a_trace(server, receiver):
    client = openai_client(server[0])
    out = client.chat.completions.create(model=client.models.list().data[0].id, max_tokens=2,
                                         messages=[{"role": "user", "content": "Hi"}])

    def spans():
        spans = received(receiver[1])
        front = [s for s in spans if s["name"] == "llm_request" and s["attributes"]["gen_ai.request.id"] == out.id]
        core = [s for s in spans if front and s["parent_span_id"] == front[0]["span_id"]]
        return (front, core) if core else None

    (front,), (core,) = wait_until(spans, what="the chat request's spans")
    assert front["parent_span_id"] == "" and front["trace_id"] == core["trace_id"]
    assert core["name"] == "llm_core" and core["attributes"]["gen_ai.request.id"].endswith(out.id)


def test_a_streamed_request_continues_the_callers_trace_too(server, receiver):
    client = openai_client(server[0])
    trace_id = "1" * 32
    stream = client.completions.create(model=client.models.list().data[0].id, prompt="Hello", max_tokens=3,
                                       stream=True, extra_headers={"traceparent": f"00-{trace_id}-{'2' * 16}-01"})
    assert [chunk.id for chunk in stream]

    def spans():
        mine = [s for s in received(receiver[1]) if s["trace_id"] == trace_id]
        return mine if len(mine) == 2 else None

    by_name = {s["name"]: s for s in wait_until(spans, what="the streamed request's spans")}
    assert by_name["llm_request"]["parent_span_id"] == "2" * 16
    assert by_name["llm_core"]["parent_span_id"] == by_name["llm_request"]["span_id"]


def test_a_dead_collector_costs_a_log_line_not_the_service(server, receiver):
    """Last in the module: it stops the receiver."""
    proc, _ = receiver
    proc.kill()
    proc.wait()
    client = openai_client(server[0])
    model = client.models.list().data[0].id
    for _ in range(3):
        assert client.completions.create(model=model, prompt="Hello", max_tokens=3).choices[0].text is not None
    line = "OTLP traces cannot be sent to"
    wait_until(lambda: line in server[1].log(), timeout=120, what="the log line about the dead collector")
    assert client.completions.create(model=model, prompt="Again", max_tokens=3).usage.completion_tokens > 0
    # one line per service (the frontend's and the core's exporters), not one per failed batch
    assert server[1].log().count(line) <= 2
