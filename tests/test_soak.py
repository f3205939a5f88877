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

from http_helpers import metric, start_serve

pytestmark = pytest.mark.integration

SOAK_SECONDS = float(os.environ.get("NVLLM_SOAK_SECONDS", "40"))
CLIENTS = 24


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


async def stop_string(client, rng, tally):
    """The frontend finds the stop string and aborts the request in the core."""
    body = {"prompt": prompt(rng), "max_tokens": 200, "ignore_eos": True, "stop": [rng.choice(WORDS)[:1]]}
    r = await client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text[:300]
    assert r.json()["choices"][0]["finish_reason"] in ("stop", "length")
    tally["good"] += 1


async def bad(client, rng, tally):
    path, body = rng.choice(BAD_BODIES)
    r = await client.post(path, json=body)
    assert r.status_code == 400, (body, r.text[:300])
    assert r.json()["error"]["param"]
    tally["bad"] += 1


async def disconnect_mid_stream(client, rng, tally):
    body = {"prompt": prompt(rng), "max_tokens": 300, "ignore_eos": True, "stream": True}
    async with client.stream("POST", "/v1/completions", json=body) as r:
        seen = 0
        async for line in r.aiter_lines():
            seen += line.startswith("data: ")
            if seen >= rng.randint(1, 5):
                break  # leaving the block closes the connection
    tally["disconnect"] += 1


async def abort_by_timeout(client, rng, tally):
    body = {"prompt": prompt(rng), "max_tokens": 400, "ignore_eos": True}
    try:
        await client.post("/v1/completions", json=body, timeout=rng.uniform(0.05, 0.5))
    except httpx.TimeoutException:
        pass
    tally["abort"] += 1


KINDS = [good_completion, good_completion, good_chat_stream, stop_string, bad, disconnect_mid_stream,
         abort_by_timeout]


def test_soak_mixed_clients_leak_nothing(server):
    base, proc = server
    tally = {"good": 0, "bad": 0, "disconnect": 0, "abort": 0}
    failures = []

    async def worker(index: int):
        rng = random.Random(index)
        limits = httpx.Limits(max_connections=4)
        async with httpx.AsyncClient(base_url=base, timeout=120, limits=limits) as client:
            deadline = time.monotonic() + SOAK_SECONDS
            while time.monotonic() < deadline:
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
    assert tally["good"] > 50 and tally["bad"] > 10 and tally["disconnect"] > 5 and tally["abort"] > 5, tally
    deadline = time.monotonic() + 60
    while True:
        text = httpx.get(base + "/metrics").text
        leaks = {name: metric(text, name) for name in ("nvllm:num_requests_running", "nvllm:num_requests_waiting",
                                                        "nvllm:frontend_requests_in_flight")}
        leaks["used blocks"] = metric(text, "nvllm:kv_cache_total_blocks") - metric(text, "nvllm:kv_cache_free_blocks")
        if not any(leaks.values()):
            break
        assert time.monotonic() < deadline, leaks
        time.sleep(0.5)
    # and it still serves
    r = httpx.post(base + "/v1/completions", json={"prompt": "still here", "max_tokens": 3}, timeout=60)
    assert r.status_code == 200
