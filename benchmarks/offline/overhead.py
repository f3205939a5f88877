"""`nvllm bench overhead`: how many tiny requests per second the frontend and the core exchange.

Each request is one prompt token and one output token (--max-tokens), so the model's work is as small as it
gets and what is measured is the path around it: Processor, ZMQ round trip, scheduling, output
processing. Clients keep `--concurrency` requests in flight through AsyncLLM. --compare-tracing PAIRS measures
what OpenTelemetry tracing costs that path (benchmarks/offline/tracing_cost.py).
"""

import asyncio
import time

from common.sampling_params import RequestOutputKind, SamplingParams
from benchmarks.result_file import write_result


async def measure(args) -> dict:
    from common.heap import freeze_startup_heap
    from frontend.async_engine.async_llm import AsyncLLM
    from common.cli.engine_args import engine_args_from

    engine = await AsyncLLM.create(engine_args_from(args))
    freeze_startup_heap()  # as a server does once its engine is up (frontend/http/server.py)
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True, output_kind=RequestOutputKind.FINAL_ONLY)
    counter = iter(range(args.num_requests))

    async def client():
        for i in counter:
            async for _ in engine.generate(None, params, f"tiny-{i}", prompt_token_ids=[100 + i % 1000]):
                pass

    await asyncio.gather(*(client() for _ in range(min(8, args.concurrency))))  # warm up
    counter = iter(range(args.num_requests))
    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(args.concurrency)))
    elapsed = time.perf_counter() - start
    engine.shutdown()
    return {"requests": args.num_requests, "concurrency": args.concurrency, "max_tokens": args.max_tokens,
            "seconds": round(elapsed, 2),
            "requests_per_s": round(args.num_requests / elapsed, 1)}


def run_overhead(args) -> int:
    result = asyncio.run(measure(args))
    print(f"tiny requests (1 prompt token, max_tokens=1): {result['requests_per_s']:.1f} req/s "
          f"({result['requests']} requests, {result['concurrency']} in flight, {result['seconds']} s)")
    if args.output_json:
        write_result(args, result)
    return 0
