"""`nvllm bench serve`: an HTTP load generator for any OpenAI-compatible server, like `vllm bench serve`.

Random prompts (token ids drawn from [100, 10000), so any model with a vocabulary of 10k+ tokens
takes them) of fixed or random length, fixed or random output lengths, EOS ignored (vLLM's
`ignore_eos` extension). Requests stream from /v1/completions; arrivals are all at once or a Poisson
process at --request-rate, at most --max-concurrency in flight. Reports request throughput, output
tok/s, and mean / median / p99 of time to first token (TTFT), time per output token after the first
(TPOT), inter-token latency (ITL, the gap between two streamed chunks) and end-to-end latency.
"""

import asyncio
import json
import logging
import math
import os
import random
import statistics
import time
from dataclasses import dataclass, field

import httpx
from benchmarks.result_file import write_result

TOKEN_ID_RANGE = (100, 10000)


@dataclass
class Result:
    ok: bool = False
    prompt_len: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    latency: float = 0.0
    itls: list[float] = field(default_factory=list)
    error: str = ""


def make_workload(args) -> list[tuple[list[int], int]]:
    """[(prompt token ids, output length)] with lengths uniform in [L(1 - r), L(1 + r)]."""
    rng = random.Random(args.seed)

    def length(mean: int) -> int:
        low, high = max(1, int(mean * (1 - args.random_range_ratio))), max(1, int(mean * (1 + args.random_range_ratio)))
        return rng.randint(low, high)

    return [([rng.randrange(*TOKEN_ID_RANGE) for _ in range(length(args.random_input_len))],
             length(args.random_output_len)) for _ in range(args.num_prompts)]


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between the closest ranks (numpy's default)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


async def one_request(client: httpx.AsyncClient, url: str, headers: dict, model: str, prompt: list[int],
                      output_len: int, ignore_eos: bool) -> Result:
    payload = {"model": model, "prompt": prompt, "max_tokens": output_len, "temperature": 0.0, "stream": True,
               "stream_options": {"include_usage": True}, "ignore_eos": ignore_eos}
    result = Result(prompt_len=len(prompt))
    start = time.perf_counter()
    last = None
    chunks = 0
    try:
        async with client.stream("POST", url, json=payload, headers=headers) as response:
            if response.status_code != 200:
                body = (await response.aread()).decode(errors="replace")
                result.error = f"HTTP {response.status_code}: {body[:300]}"
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                event = json.loads(data)
                if "error" in event:
                    result.error = str(event["error"])
                    return result
                now = time.perf_counter()
                if event.get("choices"):
                    if last is None:
                        result.ttft = now - start
                    else:
                        result.itls.append(now - last)
                    last = now
                    chunks += 1
                if event.get("usage"):
                    result.output_tokens = event["usage"].get("completion_tokens", 0)
        result.latency = time.perf_counter() - start
        result.output_tokens = result.output_tokens or chunks
        result.ok = last is not None
        if not result.ok:
            result.error = "the stream held no tokens"
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        result.error = f"{type(e).__name__}: {e}"
    return result


async def pick_model(client: httpx.AsyncClient, base_url: str, headers: dict) -> str:
    try:
        response = await client.get(f"{base_url}/v1/models", headers=headers)
    except httpx.HTTPError as e:
        raise ValueError(f"cannot reach the server at {base_url}: {type(e).__name__}: {e}") from None
    if response.status_code != 200:  # e.g. 503 while its engine is still loading: a message, not a traceback
        raise ValueError(f"{base_url}/v1/models answered {response.status_code}: {response.text[:300]}")
    return response.json()["data"][0]["id"]


async def run(args) -> dict:
    base_url = args.base_url.rstrip("/")
    url = base_url + args.endpoint
    key = getattr(args, "api_key", None) or os.environ.get("OPENAI_API_KEY") or os.environ.get("NVLLM_API_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    workload = make_workload(args)
    limits = httpx.Limits(max_connections=args.max_concurrency or args.num_prompts, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(args.timeout), limits=limits) as client:
        model = args.model or await pick_model(client, base_url, headers)
        probe = await one_request(client, url, headers, model, workload[0][0][:16], 2, args.ignore_eos)
        if not probe.ok:
            raise ValueError(f"the test request to {url} failed: {probe.error}")
        semaphore = asyncio.Semaphore(args.max_concurrency or len(workload))
        rng = random.Random(args.seed + 1)

        async def limited(prompt, output_len):
            async with semaphore:
                return await one_request(client, url, headers, model, prompt, output_len, args.ignore_eos)

        start = time.perf_counter()
        tasks = []
        for prompt, output_len in workload:
            tasks.append(asyncio.create_task(limited(prompt, output_len)))
            if math.isfinite(args.request_rate):
                await asyncio.sleep(rng.expovariate(args.request_rate))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
    return summarize(args, model, results, duration)


def summarize(args, model: str, results: list[Result], duration: float) -> dict:
    ok = [r for r in results if r.ok]
    output_tokens = sum(r.output_tokens for r in ok)
    input_tokens = sum(r.prompt_len for r in ok)
    ttfts = [r.ttft * 1000 for r in ok]
    tpots = [(r.latency - r.ttft) / (r.output_tokens - 1) * 1000 for r in ok if r.output_tokens > 1]
    itls = [x * 1000 for r in ok for x in r.itls]
    e2es = [r.latency * 1000 for r in ok]
    figures = {
        "model": model, "base_url": args.base_url, "num_prompts": args.num_prompts,
        "max_concurrency": args.max_concurrency,
        "request_rate": args.request_rate if math.isfinite(args.request_rate) else "inf",  # strict JSON
        "random_input_len": args.random_input_len, "random_output_len": args.random_output_len,
        "random_range_ratio": args.random_range_ratio,
        "completed": len(ok), "failed": len(results) - len(ok), "duration_s": round(duration, 3),
        "total_input_tokens": input_tokens, "total_output_tokens": output_tokens,
        "request_throughput": round(len(ok) / duration, 3),
        "output_throughput": round(output_tokens / duration, 2),
        "total_token_throughput": round((input_tokens + output_tokens) / duration, 2),
        "errors": sorted({r.error for r in results if not r.ok})[:5],
    }
    for name, values in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2es)):
        figures[f"mean_{name}_ms"] = round(statistics.fmean(values), 2) if values else 0.0
        figures[f"median_{name}_ms"] = round(statistics.median(values), 2) if values else 0.0
        figures[f"p99_{name}_ms"] = round(percentile(values, 99), 2)
    return figures


def print_figures(f: dict) -> None:
    rows = [
        ("Successful requests", f["completed"]), ("Failed requests", f["failed"]),
        ("Benchmark duration (s)", f["duration_s"]), ("Total input tokens", f["total_input_tokens"]),
        ("Total generated tokens", f["total_output_tokens"]),
        ("Request throughput (req/s)", f["request_throughput"]),
        ("Output token throughput (tok/s)", f["output_throughput"]),
        ("Total token throughput (tok/s)", f["total_token_throughput"]),
    ]
    titles = {"ttft": "Time to First Token", "tpot": "Time per Output Token (excl. 1st token)",
              "itl": "Inter-token Latency", "e2el": "End-to-end Latency"}
    print("{:=^60}".format(" Serving Benchmark Result "))
    for name, value in rows:
        print(f"{name:<44}{value:>16}")
    for key, title in titles.items():
        print("{:-^60}".format(title))
        for stat in ("mean", "median", "p99"):
            label = f"{stat.capitalize() if stat != 'p99' else 'P99'} {key.upper()} (ms)"
            print(f"{label:<44}{f[f'{stat}_{key}_ms']:>16.2f}")
    print("=" * 60)
    for error in f["errors"]:
        print(f"error: {error}")


def run_bench_serve(args) -> int:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # no log line per request
    figures = asyncio.run(run(args))
    print_figures(figures)
    if args.output_json:
        write_result(args, figures)
    return 0 if figures["completed"] else 1
