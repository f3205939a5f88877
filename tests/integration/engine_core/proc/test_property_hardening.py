"""Property-based: random and hostile input never takes a service down or leaks.

- EngineCoreRequests with random field values go straight into a real core process as raw frames:
  every one finishes, either normally or with an ERROR naming one of its fields; the core lives,
  and afterwards nothing runs and every KV block is free.
- Random JSON bodies go to the HTTP API of a real `nvllm serve`: every answer is a 2xx or an OpenAI
  4xx error body naming a field or the body; never a 5xx; afterwards /metrics shows the engine idle.
"""

import json
import time

import httpx
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.wire_messages import EngineCoreRequest, FinishReason
from common.sampling_params import SamplingParams
from tests.support.http_helpers import metric, start_serve
from tests.support.core_peer import Peer, core_args

pytestmark = pytest.mark.integration

FIELDS = {"request_id", "prompt", "n", "temperature", "top_p", "top_k", "min_p", "seed", "max_tokens", "min_tokens",
          "stop", "stop_token_ids", "repetition_penalty", "presence_penalty", "frequency_penalty", "logprobs",
          "prompt_logprobs", "eos_token_ids", "arrival_time", "cache_salt"}

ints = st.one_of(st.integers(-3, 40), st.integers(0, 2**64 - 1), st.sampled_from([49151, 49152, 2**31, 2**63]))
floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.floats(-3, 3))
token_lists = st.lists(ints, max_size=20)


@st.composite
def hostile_requests(draw, index: int = 0):
    params = SamplingParams(
        n=draw(st.one_of(st.just(1), ints)),
        temperature=draw(st.one_of(st.just(0.0), floats)),
        top_p=draw(st.one_of(st.just(1.0), floats)),
        top_k=draw(st.one_of(st.just(0), ints)),
        min_p=draw(st.one_of(st.just(0.0), floats)),
        seed=draw(st.one_of(st.none(), ints)),
        max_tokens=draw(st.one_of(st.integers(1, 6), st.none(), ints)),
        min_tokens=draw(st.one_of(st.just(0), ints)),
        stop=draw(st.lists(st.text(max_size=5), max_size=3)),
        stop_token_ids=draw(st.one_of(st.just([]), token_lists)),
        repetition_penalty=draw(st.one_of(st.just(1.0), floats)),
        presence_penalty=draw(st.one_of(st.just(0.0), floats)),
        frequency_penalty=draw(st.one_of(st.just(0.0), floats)),
        logprobs=draw(st.one_of(st.none(), ints)),
        prompt_logprobs=draw(st.one_of(st.none(), ints)),
    )
    return EngineCoreRequest(
        request_id=draw(st.text(min_size=0, max_size=8)) + f"#{draw(st.integers(0, 10**9))}",
        prompt_token_ids=draw(st.one_of(st.lists(st.integers(0, 49151), min_size=1, max_size=40), token_lists)),
        sampling_params=params,
        eos_token_ids=draw(st.one_of(st.just([2]), token_lists)),
        arrival_time=draw(st.one_of(st.just(0.0), floats)),
        cache_salt=draw(st.one_of(st.none(), st.text(max_size=10))),
    )


@pytest.fixture(scope="module")
def core(tiny_models):
    from common.transport import private_ipc_address
    from frontend.core_link.core_process import start_core_process, stop_core_process

    address = private_ipc_address()
    proc = start_core_process(core_args(tiny_models["llama"], max_request_tokens=4096), address)
    peer = Peer(address)
    yield peer, proc
    peer.close()
    stop_core_process(proc)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(batch=st.lists(hostile_requests(), min_size=1, max_size=6, unique_by=lambda r: r.request_id))
def test_random_requests_never_kill_the_core(core, batch):
    peer, proc = core
    for request in batch:
        peer.add(request)
    done = peer.finished({r.request_id for r in batch}, timeout=120)
    for request in batch:
        out = done[request.request_id]
        if out.finish_reason == FinishReason.ERROR:
            field = out.error.split(" ", 1)[0]
            assert field in FIELDS, out.error[:300]
    assert proc.poll() is None
    stats = peer.stats()
    assert stats.gauges.num_running == 0 and stats.gauges.num_waiting == 0
    assert stats.gauges.num_free_blocks == stats.gauges.num_total_blocks


# ---- HTTP ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_models):
    base, _, proc = start_serve([tiny_models["llama"], "--disable-uvicorn-access-log", "--dtype", "float32",
                                 "--kv-cache-memory", "64MiB", "--max-model-len", "512"],
                                str(tmp_path_factory.mktemp("serve") / "serve.log"))
    with httpx.Client(base_url=base, timeout=120) as client:
        yield client, proc
    proc.stop()


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True, allow_infinity=True),
              st.text(max_size=20)),
    lambda inner: st.one_of(st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12)
COMPLETION_FIELDS = ["prompt", "n", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids",
                     "logprobs", "echo", "stream", "min_tokens", "presence_penalty", "frequency_penalty",
                     "repetition_penalty", "ignore_eos", "stream_options", "user", "model", "cache_salt", "extra"]
CHAT_FIELDS = ["messages", "n", "temperature", "top_p", "logprobs", "top_logprobs", "stop", "stream", "seed",
               "min_tokens", "add_generation_prompt", "model", "cache_salt", "extra"]
messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "robot"]),
                                           "content": st.one_of(st.text(max_size=30), json_values)}), max_size=3)


@st.composite
def bodies(draw):
    chat = draw(st.booleans())
    fields = CHAT_FIELDS if chat else COMPLETION_FIELDS
    body = {name: draw(json_values) for name in draw(st.lists(st.sampled_from(fields), max_size=6, unique=True))}
    if chat and draw(st.booleans()):
        body["messages"] = draw(messages)
    elif not chat and draw(st.booleans()):
        body["prompt"] = draw(st.one_of(st.text(max_size=30), st.lists(st.integers(-5, 50000), max_size=8)))
    # bounded output, so a body that is valid finishes fast
    body["max_completion_tokens" if chat else "max_tokens"] = draw(st.one_of(st.integers(1, 4), json_values))
    return ("/v1/chat/completions" if chat else "/v1/completions"), body


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=bodies())
def test_random_json_bodies_get_2xx_or_an_openai_4xx(server, case):
    client, proc = server
    path, body = case
    r = client.post(path, content=json.dumps(body).encode("utf-8", "surrogatepass"),
                    headers={"Content-Type": "application/json"})
    assert r.status_code < 500, (body, r.text[:500])
    if r.status_code >= 400:
        error = r.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert proc.proc.poll() is None


def test_after_random_bodies_the_engine_is_idle(server):
    client, _ = server
    deadline = time.monotonic() + 60
    while True:
        text = client.get("/metrics").text
        idle = metric(text, "nvllm:num_requests_running") == 0 and metric(text, "nvllm:num_requests_waiting") == 0
        if idle and metric(text, "nvllm:kv_cache_free_blocks") == metric(text, "nvllm:kv_cache_total_blocks"):
            return
        assert time.monotonic() < deadline, text
        time.sleep(0.2)


def test_encode_of_hostile_requests_round_trips():
    """The strategy's requests really reach the core as drawn (msgspec carries 2**64-1 and NaN)."""
    request = EngineCoreRequest(request_id="x", prompt_token_ids=[2**64 - 1],
                                sampling_params=SamplingParams(temperature=float("nan")))
    back = msgspec.msgpack.decode(msgspec.msgpack.encode(request), type=EngineCoreRequest)
    assert back.prompt_token_ids == [2**64 - 1] and back.sampling_params.temperature != 0
