"""Tracing, in one process: the offline LLM with an in-process core on a tiny model, spans caught by the SDK's
in-memory exporter. Each request gives one frontend span ("llm_request", vLLM's gen_ai.* attributes) and one
core span ("llm_core") whose parent it is; a caller's traceparent (or current span) becomes the request span's
parent; with tracing off no span is made and the SDK is not even imported."""

import subprocess
import sys

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

import common.tracing
from tests.support.tiny_models import kv_block_bytes
from engine_core.families.catalog import read_spec
from engine_core.weights.model_folder import read_hf_config
from common.errors import InvalidParameter
from common.wire_messages import EngineCoreRequest
from common.sampling_params import SamplingParams
from common.tracing import traces_protocol
from common.validation import check_trace_headers
from frontend.offline.llm import LLM
from frontend.request_path.request_tracing import CALLER_TRACE_HEADERS

pytestmark = pytest.mark.integration

CALLER_TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN_ID = "00f067aa0ba902b7"


@pytest.fixture(scope="module")
def traced(tiny_models):
    exporter = InMemorySpanExporter()
    patch = pytest.MonkeyPatch()
    patch.setattr(common.tracing, "_exporter", lambda endpoint, protocol: exporter)
    llm = LLM(tiny_models["llama"], dtype="float32", kv_cache_memory="16MiB", max_model_len=256, multiprocess=False,
              otlp_traces_endpoint="http://127.0.0.1:9")
    yield llm, exporter
    llm.shutdown()
    patch.undo()


def run(traced, prompts, params, headers=None):
    """Generates and returns the spans that came of it, once both services flushed them."""
    llm, exporter = traced
    exporter.clear()
    token = CALLER_TRACE_HEADERS.set(headers)
    try:
        outs = llm.generate(prompts, params, use_tqdm=False)
    finally:
        CALLER_TRACE_HEADERS.reset(token)
    llm.tracing.tracing.provider.force_flush()
    llm.client.core.spans.tracing.provider.force_flush()
    return outs, exporter.get_finished_spans()


def by_name(spans, name):
    return [s for s in spans if s.name == name]


def test_one_request_span_with_its_core_child(traced):
    params = SamplingParams(max_tokens=5, temperature=0.7, top_p=0.9, seed=3, ignore_eos=True)
    (out,), spans = run(traced, ["Hello there"], params)
    (front,), (core,) = by_name(spans, "llm_request"), by_name(spans, "llm_core")
    assert front.kind == SpanKind.SERVER and front.parent is None
    assert front.resource.attributes["service.name"] == "nvllm-frontend"
    assert core.resource.attributes["service.name"] == "nvllm-engine-core"
    # the core's span is the frontend span's child, in its trace
    assert core.parent.span_id == front.context.span_id and core.context.trace_id == front.context.trace_id
    a = front.attributes
    assert a["gen_ai.request.id"] == out.request_id
    assert a["gen_ai.response.model"] == traced[0].model_info.model_name
    assert a["gen_ai.usage.prompt_tokens"] == len(out.prompt_token_ids)
    assert a["gen_ai.usage.completion_tokens"] == 5
    assert (a["gen_ai.request.temperature"], a["gen_ai.request.top_p"]) == (pytest.approx(0.7), pytest.approx(0.9))
    assert (a["gen_ai.request.max_tokens"], a["gen_ai.request.n"], a["gen_ai.request.seed"]) == (5, 1, 3)
    assert a["gen_ai.response.finish_reasons"] == ("length",)
    e2e, ttft, queue = a["gen_ai.latency.e2e"], a["gen_ai.latency.time_to_first_token"], a["gen_ai.latency.time_in_queue"]
    assert 0 <= queue <= ttft <= e2e
    assert front.start_time <= core.start_time and core.end_time <= front.end_time
    events = [e.name for e in core.events]
    assert events[:2] == ["scheduled", "prefilled"] and "preempted" not in events
    assert core.attributes["gen_ai.usage.completion_tokens"] == 5
    assert core.attributes["gen_ai.response.finish_reasons"] == ("length",)


def test_callers_traceparent_is_the_parent_and_n_samples_share_one_span(traced):
    headers = {"traceparent": f"00-{CALLER_TRACE_ID}-{CALLER_SPAN_ID}-01"}
    params = SamplingParams(max_tokens=3, n=2, seed=1, ignore_eos=True)
    _, spans = run(traced, ["One", "Two"], params, headers)
    fronts, cores = by_name(spans, "llm_request"), by_name(spans, "llm_core")
    assert len(fronts) == 2 and len(cores) == 4  # one span per request, one core span per sample
    for front in fronts:
        assert front.context.trace_id == int(CALLER_TRACE_ID, 16)
        assert front.parent.span_id == int(CALLER_SPAN_ID, 16) and front.parent.is_remote
        assert front.attributes["gen_ai.request.n"] == 2
        assert front.attributes["gen_ai.usage.completion_tokens"] == 6
        assert front.attributes["gen_ai.response.finish_reasons"] == ("length", "length")
        assert sum(c.parent.span_id == front.context.span_id for c in cores) == 2


def test_the_core_span_records_a_preemption(tiny_models):
    """24 blocks of 4 tokens for four requests that grow to 41 tokens each: some are preempted, and their core spans
    say so (preempted, then scheduled again)."""
    path = tiny_models["llama"]
    spec = read_spec(read_hf_config(path))
    block = kv_block_bytes(spec.num_layers, spec.num_kv_heads, spec.head_dim, "float32", block_size=4)
    exporter = InMemorySpanExporter()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(common.tracing, "_exporter", lambda endpoint, protocol: exporter)
        with LLM(path, dtype="float32", block_size=4, kv_cache_memory=24 * block, max_model_len=96,
                 max_num_batched_tokens=16, multiprocess=False, otlp_traces_endpoint="http://127.0.0.1:9") as llm:
            tokens = list(range(5, 25))
            llm.generate([tokens[:9], tokens[3:20], tokens[5:11], tokens[:17]],
                         SamplingParams(temperature=0, max_tokens=24, ignore_eos=True), use_tqdm=False)
            assert llm.get_stats().totals.num_preemptions > 0
    cores = by_name(exporter.get_finished_spans(), "llm_core")
    assert len(cores) == 4
    preempted = [c for c in cores if c.attributes["gen_ai.request.num_preemptions"] > 0]
    assert preempted
    for core in preempted:
        events = [e.name for e in core.events]
        assert events.count("preempted") == core.attributes["gen_ai.request.num_preemptions"]
        assert events[events.index("preempted") + 1] == "scheduled"  # it runs again


def test_bad_trace_headers_are_refused_by_name():
    with pytest.raises(InvalidParameter, match="trace_headers"):
        check_trace_headers({"cookie": "x"})
    with pytest.raises(InvalidParameter, match="tracestate must be at most 512"):
        check_trace_headers({"tracestate": "a" * 600})
    check_trace_headers({"traceparent": f"00-{CALLER_TRACE_ID}-{CALLER_SPAN_ID}-01"})
    assert EngineCoreRequest(request_id="r", prompt_token_ids=[1], sampling_params=SamplingParams()).trace_headers is None


def test_protocol_variable(monkeypatch):
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_PROTOCOL", raising=False)
    assert traces_protocol() == "grpc"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    assert traces_protocol() == "http/protobuf"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json")
    with pytest.raises(ValueError, match="OTEL_EXPORTER_OTLP_TRACES_PROTOCOL must be one of grpc, http/protobuf"):
        traces_protocol()


def test_tracing_off_imports_no_opentelemetry_sdk():
    """Importing the services and the HTTP app with tracing off loads neither the SDK nor an exporter (FastAPI
    itself imports the OpenTelemetry API)."""
    code = ("import sys, frontend.http.app, frontend.offline.llm, frontend.async_engine.async_llm, engine_core.proc.core; "
            "print(sorted(m for m in sys.modules if m.startswith(('opentelemetry.sdk', 'opentelemetry.exporter'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_bench_overhead_compares_tracing_off_dead_and_live(tiny_models, tmp_path):
    """The costs page's figures: `nvllm bench overhead --compare-tracing ROUNDS`, on a tiny workload."""
    import json

    from frontend.cli.main import main

    out = tmp_path / "tracing.json"
    assert main(["bench", "overhead", tiny_models["llama"], "--dtype", "float32", "--kv-cache-memory", "32MiB",
                 "--max-model-len", "128", "--num-requests", "20", "--concurrency", "4", "--compare-tracing", "1",
                 "--output-json", str(out)]) == 0
    results = json.loads(out.read_text())["results"]
    assert set(results["median_ratio_to_off"]) == {"dead_collector", "live_collector"}
    assert all(r > 0 for r in results["median_ratio_to_off"].values())
    assert results["live_collector_exports"] > 0  # the live run's spans reached the sink


def test_every_service_takes_the_endpoint_and_a_bad_one_is_named():
    from common.cli.engine_args import engine_args_from
    from common.config import EngineArgs
    from frontend.cli.main import build_parser

    parser = build_parser()
    for command in (["serve"], ["engine-core"], ["frontend"]):
        ns = parser.parse_args([*command, "--otlp-traces-endpoint", "grpc://collector:4317"])
        assert ns.otlp_traces_endpoint == "grpc://collector:4317"
    assert engine_args_from(parser.parse_args(["serve", "--otlp-traces-endpoint", "http://c:4318"])) \
        .otlp_traces_endpoint == "http://c:4318"
    with pytest.raises(ValueError, match="otlp_traces_endpoint must be a URL like http://localhost:4317"):
        EngineArgs(otlp_traces_endpoint="collector:4317").validate()
