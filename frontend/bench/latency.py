"""`nvllm bench latency`: time per output token for one request at a time, what one chatting user feels.

One request of `--input-len` random prompt tokens (seeded) asks for `--output-len` tokens, EOS ignored,
greedy, streamed token by token through AsyncLLM (engine core in its own process, as `nvllm serve` runs
it), `--num-iters` times after one warm-up. Per request: time to first token, and ms per output token
after it (the last token's time minus the first's, over the tokens between). Medians are printed with
the weight-streaming bound of this model on this machine, measured in the same run
(engine_core/weight_stream.py, in a child: the frontend does not import torch), and how far above it
the engine runs.
"""

import asyncio
import json
import os
import random
import statistics
import sys
import time

from common.sampling_params import RequestOutputKind, SamplingParams


def weight_stream_bound(args) -> dict | None:
    """The child's figures, or None on devices it does not measure (a GPU)."""
    from frontend.bench.cpu_suite import ROOT, _run_child

    if args.device == "cuda":
        return None
    cmd = [sys.executable, "-m", "engine_core.weight_stream", "--quantization", args.quantization, "--dtype",
           args.dtype] + ([args.model] if args.model else [])
    return _run_child(cmd, dict(os.environ))


async def _measure(args) -> list[tuple[float, float]]:
    from frontend.async_llm import AsyncLLM
    from frontend.cli.engine_args import engine_args_from

    engine = await AsyncLLM.create(engine_args_from(args))
    try:
        rng = random.Random(args.bench_seed)
        prompt = [rng.randrange(100, 10000) for _ in range(args.input_len)]
        params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True,
                                output_kind=RequestOutputKind.DELTA)
        runs = []
        for i in range(args.num_iters + 1):
            start = time.perf_counter()
            times = []
            async for out in engine.generate(None, params, f"latency-{i}", prompt_token_ids=prompt):
                now = time.perf_counter()
                times += [now] * len(out.outputs[0].token_ids)
            if i:  # the first warms the engine up
                runs.append((times[0] - start, (times[-1] - times[0]) / max(1, len(times) - 1)))
        return runs
    finally:
        engine.shutdown()


def run_latency(args) -> int:
    bound = weight_stream_bound(args)
    runs = asyncio.run(_measure(args))
    ttft = statistics.median(r[0] for r in runs) * 1e3
    tpot = statistics.median(r[1] for r in runs) * 1e3
    result = {"input_len": args.input_len, "output_len": args.output_len, "iterations": args.num_iters,
              "ttft_ms": round(ttft, 2), "ms_per_output_token": round(tpot, 3),
              "output_tokens_per_s": round(1e3 / tpot, 1), "tpot_ms_each": [round(r[1] * 1e3, 3) for r in runs],
              "weight_stream": bound}
    print(f"one request, {args.input_len} prompt + {args.output_len} output tokens, {args.num_iters} runs (median):")
    print(f"  time to first token {ttft:.1f} ms; {tpot:.2f} ms per output token ({1e3 / tpot:.1f} tok/s)")
    if bound:
        print(f"  weight-streaming bound: {bound['streamed_bytes'] / 1e6:.1f} MB of weights per step "
              f"(quantization: {bound['quantization']}) at {bound['bandwidth_gbs']:.1f} GB/s read = "
              f"{bound['bound_ms']:.2f} ms; this engine runs at {tpot / bound['bound_ms']:.2f}x the bound")
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


def register(kinds, formatter) -> None:
    from frontend.cli.engine_args import add_engine_args

    p = kinds.add_parser("latency", help="ms per output token of one request at a time", formatter_class=formatter)
    add_engine_args(p)
    p.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"],
                   help="logging level")
    p.add_argument("--input-len", type=int, default=128, help="prompt tokens")
    p.add_argument("--output-len", type=int, default=128, help="output tokens")
    p.add_argument("--num-iters", type=int, default=5, help="timed requests (after one warm-up)")
    p.add_argument("--bench-seed", type=int, default=0, help="seed of the random prompt")
    p.add_argument("--output-json", default=None, help="also write the figures here")
    p.set_defaults(func=run_latency)
