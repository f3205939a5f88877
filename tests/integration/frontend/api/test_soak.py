"""Soak: many concurrent clients mixing good requests, bad ones, disconnects and aborts against one
`nvllm serve`, for a bounded time. Every good request completes; afterwards nothing leaks: no
request running or waiting in the core, every KV block free, no request state left in the frontend.
"""

import asyncio
import json
import os
import random
import time

import httpx
import pytest

from tests.support.http_helpers import metric, start_serve

pytestmark = pytest.mark.integration

SOAK_SECONDS = float(os.environ.get("NVLLM_SOAK_SECONDS", "20"))
CLIENTS = 24
# the soak goes on past SOAK_SECONDS until every kind of event has happened this often (a slow machine
# takes longer), up to a deadline far above what that takes
AT_LEAST = {"good": 50, "bad": 10, "disconnect": 5, "timeout": 5}
HARD_DEADLINE_SECONDS = 600


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_models):
    # a small KV cache and few sequences, so requests queue, preempt and share prefixes
    base, _, proc = start_serve([tiny_models["llama"], "--disable-uvicorn-access-log", "--dtype", "float32",
                                 "--kv-cache-memory", "4MiB", "--max-model-len", "512", "--max-num-seqs", "8",
                                 "--max-num-batched-tokens", "256"], str(tmp_path_factory.mktemp("soak") / "serve.log"))
    yield base, proc
    proc.stop()


BAD_BODIES = [
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 2, "min_tokens": 1, "stop_token_ids": [49152]}),
    ("/v1/completions", {"prompt": [1, 2, 2**40]}),
    ("/v1/completions", {"prompt": "Hi", "logprobs": 1000000}),
    ("/v1/completions", {"prompt": "Hi", "n": 100000}),
    ("/v1/completions", {"prompt": "Hi", "stop": ["x"] * 5000}),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 100000}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "top_k": 2**40}),
    ("/v1/chat/completions", {"messages": []}),
]
WORDS = "the cat sat on a mat while dogs ran past the old red barn and birds sang".split()


def prompt(rng: random.Random) -> str:
    shared = "You are a careful assistant. " * rng.choice([0, 4])  # some share a prefix
    return shared + " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 60)))


async def good_completion(client, rng, tally):
    max_tokens = rng.randint(1, 24)
    body = {"prompt": prompt(rng), "max_tokens": max_tokens, "temperature": rng.choice([0, 0.8]),
            "seed": rng.randint(0, 1000), "n": rng.choice([1, 1, 2]), "ignore_eos": True}
    r = await client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text[:300]
    choices = r.json()["choices"]
    assert len(choices) == body["n"] and all(c["finish_reason"] == "length" for c in choices), choices
    tally["good"] += 1
    tally["length"] += body["n"]


async def good_chat_stream(client, rng, tally):
    body = {"messages": [{"role": "user", "content": prompt(rng)}], "max_tokens": rng.randint(1, 24),
            "stream": True, "ignore_eos": True}
    finish = None
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for c in json.loads(line[6:]).get("choices", []):
                    finish = c.get("finish_reason") or finish
    assert finish == "length"
    tally["good"] += 1
    tally["length"] += 1


async def stop_string(client, rng, tally):
    """The frontend finds the stop string and aborts the request in the core."""
    body = {"prompt": prompt(rng), "max_tokens": 200, "ignore_eos": True, "stop": [rng.choice(WORDS)[:1]]}
    r = await client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text[:300]
    reason = r.json()["choices"][0]["finish_reason"]
    assert reason in ("stop", "length"), reason
    tally["good"] += 1
    tally[reason] += 1


async def bad(client, rng, tally):
    path, body = rng.choice(BAD_BODIES)
    r = await client.post(path, json=body)
    assert r.status_code == 400, (body, r.text[:300])
    assert r.json()["error"]["param"]
    tally["bad"] += 1


async def disconnect_mid_stream(client, rng, tally):
    """The client leaves after a few events: the server has begun the request (it streamed tokens), and
    with hundreds of tokens still to come it cannot have finished it; the server must abort it."""
    body = {"prompt": prompt(rng), "max_tokens": 400, "ignore_eos": True, "stream": True}
    leave_after, events, finish = rng.randint(1, 5), 0, None
    async with client.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events += 1
                for c in json.loads(line[6:]).get("choices", []):
                    finish = c.get("finish_reason") or finish
                if events >= leave_after and finish is None:
                    tally["disconnect"] += 1
                    return  # leaving the block closes the connection
    assert finish == "length"  # it ran to its end before the client meant to leave
    tally["good"] += 1
    tally["length"] += 1


async def abort_by_timeout(client, rng, tally):
    """The client gives up waiting for a non-streamed answer. Only a read timeout means the whole request
    went out (and got no answer); a connect, write or pool timeout means the server never had it."""
    body = {"prompt": prompt(rng), "max_tokens": 400, "ignore_eos": True}
    try:
        r = await client.post("/v1/completions", json=body, timeout=rng.uniform(0.05, 0.5))
    except httpx.ReadTimeout:
        tally["timeout"] += 1
        return
    except httpx.TimeoutException:
        tally["unsent"] += 1
        return
    assert r.status_code == 200, r.text[:300]  # it was answered in time: a good request after all
    assert r.json()["choices"][0]["finish_reason"] == "length", r.text[:300]
    tally["good"] += 1
    tally["length"] += 1


KINDS = [good_completion, good_completion, good_chat_stream, stop_string, bad, disconnect_mid_stream,
         abort_by_timeout]


def finished(text: str, reason: str) -> float:
    """Completions the frontend counted as finished for this reason (a series appears with its first)."""
    name = f'nvllm:request_success_total{{finished_reason="{reason}"}}'
    return metric(text, name) if name in text else 0.0


REASONS = ("length", "stop", "abort", "error")


def test_soak_mixed_clients_leak_nothing(server):
    base, proc = server
    before = httpx.get(base + "/metrics").text
    # length/stop: choices the clients saw end so; disconnect: streams left mid-way; timeout: non-streamed
    # requests given up after they were sent; unsent: timed out before the request went out
    tally = {"good": 0, "bad": 0, "disconnect": 0, "timeout": 0, "unsent": 0, "length": 0, "stop": 0}
    failures = []
    soak_end = time.monotonic() + SOAK_SECONDS
    hard_deadline = soak_end + HARD_DEADLINE_SECONDS

    def done() -> bool:
        return time.monotonic() >= soak_end and all(tally[k] > n for k, n in AT_LEAST.items())

    async def worker(index: int):
        rng = random.Random(index)
        limits = httpx.Limits(max_connections=4)
        async with httpx.AsyncClient(base_url=base, timeout=120, limits=limits) as client:
            while not done():
                assert time.monotonic() < hard_deadline, f"too few of some kind of event: {tally} (want {AT_LEAST})"
                kind = rng.choice(KINDS)
                try:
                    await kind(client, rng, tally)
                except AssertionError as e:
                    failures.append(f"{kind.__name__}: {e}")

    async def main():
        await asyncio.gather(*(worker(i) for i in range(CLIENTS)))

    asyncio.run(main())
    assert not failures, failures[:5]
    assert proc.proc.poll() is None
    deadline = time.monotonic() + 300  # far above the seconds the last aborts take to land
    while True:
        text = httpx.get(base + "/metrics").text
        leaks = {name: metric(text, name) for name in ("nvllm:num_requests_running", "nvllm:num_requests_waiting",
                                                        "nvllm:frontend_requests_in_flight")}
        leaks["used blocks"] = metric(text, "nvllm:kv_cache_total_blocks") - metric(text, "nvllm:kv_cache_free_blocks")
        if not any(leaks.values()):
            break
        assert time.monotonic() < deadline, leaks
        time.sleep(0.5)
    # every completion the server finished is one a client saw finish, or one a client cut off: no
    # request the test abandoned ran on to its end (or failed), and none the clients saw end was "aborted"
    counted = {reason: finished(text, reason) - finished(before, reason) for reason in REASONS}
    assert (counted["length"], counted["stop"], counted["error"]) == (tally["length"], tally["stop"], 0), (counted, tally)
    # every stream a client left was aborted, exactly once, and so was every timed-out request the server
    # had begun. Which timed-out requests those were the client cannot see (one it gave up on before the
    # server read it left nothing to abort), so they are bounded: at most all, and at least one, so the
    # non-streamed path was cut off for real
    aborted_timeouts = counted["abort"] - tally["disconnect"]
    assert 1 <= aborted_timeouts <= tally["timeout"], (counted, tally)
    # each of those aborts reached the core (its own count), beside the stop-string finishes the frontend
    # ended in the core before the core had ended them itself
    in_core = metric(text, "nvllm:core_aborted_requests_total") - metric(before, "nvllm:core_aborted_requests_total")
    assert counted["abort"] <= in_core <= counted["abort"] + counted["stop"], (in_core, counted, tally)
    # and it still serves
    r = httpx.post(base + "/v1/completions", json={"prompt": "still here", "max_tokens": 3}, timeout=60)
    assert r.status_code == 200
