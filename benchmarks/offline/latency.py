"""`nvllm bench latency`: time per output token for one request at a time, what one chatting user feels.

One request of `--input-len` random prompt tokens asks for `--output-len` tokens, EOS ignored, greedy, streamed
token by token through AsyncLLM (engine core in its own process, as `nvllm serve` runs it), `--num-iters` times
after one warm-up. Each request's prompt is drawn afresh (seeded), so its time to first token is a real prefill,
never a prefix-cache hit. Per request: time to first token, and ms per output token after it (the last token's
time minus the first's, over the tokens between). Medians are printed with
the weight-streaming bound of this model on this machine, measured in the same run
(benchmarks/torch_side/weight_stream.py, in a child: this process stays torch-free), and how far above it
the engine runs.

`--prompt copy-edit` sends a fixed text instead, which the answer repeats with an edit (the case prompt
lookup is made for); the same text every time, so the engines run with the prefix cache off, and the time to
first token is again a real prefill. With `--speculative-config`, a second engine without it takes the same requests in
turn with the first, and the ratio of ms per output token is printed with the share of proposals kept.
"""

import asyncio
import os
import random
import statistics
import sys
import time

import msgspec

from common.sampling_params import RequestOutputKind, SamplingParams
from benchmarks.result_file import write_result


def weight_stream_bound(args) -> dict | None:
    """The child's figures, or None on devices it does not measure (a GPU)."""
    from benchmarks.cpu.suite import _run_child

    if args.device == "cuda":
        return None
    cmd = [sys.executable, "-m", "benchmarks.torch_side.weight_stream", "--quantization", args.quantization, "--dtype",
           args.dtype] + ([args.model] if args.model else [])
    return _run_child(cmd, dict(os.environ))


# an email that the answer repeats with one edit: SmolLM2-135M copies it, edit made, for 128 tokens
COPY_EDIT_TEXT = (
    "The meeting is moved from Tuesday to Thursday at 10 am in room 4. Please bring the quarterly report, the budget "
    "draft and your notes from the last review. Lunch will be served after the meeting, and the afternoon is free for "
    "follow-up work with your teams. If you cannot attend, send your update to Maria by Wednesday evening so that she "
    "can present it for you. The slides from the last meeting are in the shared folder under reviews, and the new "
    "budget figures will be added there on Monday. Parking is available in the north garage; visitors should sign in "
    "at the front desk and collect a badge before going up to the fourth floor.")
COPY_EDIT_PROMPT = f"Original email:\n{COPY_EDIT_TEXT}\n\nThe same email, with Thursday changed to Friday:\n"


def _prompt(args, iteration: int) -> tuple[str | None, list[int] | None]:
    """(text, token ids) of one request: one of them. Random prompts differ from one request to the next (a
    repeated prompt would find its blocks in the prefix cache, and its time to first token would be no prefill)."""
    if args.prompt == "copy-edit":
        return COPY_EDIT_PROMPT, None
    rng = random.Random(args.bench_seed * 1_000_003 + iteration)
    return None, [rng.randrange(100, 10000) for _ in range(args.input_len)]


async def _measure(engines_args: list, args) -> tuple[list[list[tuple[float, float]]], int, list]:
    """Per engine, (ttft, s per token) of each timed request; the prompt's length; each core's stats after.
    With two engines both stay up and take the requests in turn, so a slow spell of a shared machine
    weighs on both alike."""
    from frontend.async_engine.async_llm import AsyncLLM

    engines = []
    try:
        for engine_args in engines_args:
            engines.append(await AsyncLLM.create(engine_args))
        params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True,
                                output_kind=RequestOutputKind.DELTA)
        runs, prompt_len = [[] for _ in engines], 0
        for i in range(args.num_iters + 1):
            text, token_ids = _prompt(args, i)
            for engine, engine_runs in zip(engines, runs):
                start = time.perf_counter()
                times = []
                async for out in engine.generate(text, params, f"latency-{i}", prompt_token_ids=token_ids):
                    now = time.perf_counter()
                    times += [now] * len(out.outputs[0].token_ids)
                    prompt_len = len(out.prompt_token_ids or ())
                if i:  # the first warms the engine up
                    engine_runs.append((times[0] - start, (times[-1] - times[0]) / max(1, len(times) - 1)))
        return runs, prompt_len, [await engine.get_stats() for engine in engines]
    finally:
        for engine in engines:
            engine.shutdown()


def run_latency(args) -> int:
    from common.cli.engine_args import engine_args_from

    bound = weight_stream_bound(args)
    engine_args = engine_args_from(args)
    if args.prompt == "copy-edit":  # one text every time: its second request would be a prefix-cache hit
        engine_args.enable_prefix_caching = False
    spec = engine_args.speculative_config
    if spec is not None and engine_args.cpu_threads is None:
        # each core would see the other's turn as a busy neighbour and shrink its pool for the next second
        engine_args.cpu_threads = len(os.sched_getaffinity(0))
    pair = [engine_args] + ([msgspec.structs.replace(engine_args, speculative_config=None)] if spec else [])
    runs, prompt_len, stats = asyncio.run(_measure(pair, args))
    ttft = statistics.median(r[0] for r in runs[0]) * 1e3
    tpot = statistics.median(r[1] for r in runs[0]) * 1e3
    result = {"prompt": args.prompt, "input_len": prompt_len, "output_len": args.output_len,
              "iterations": args.num_iters, "ttft_ms": round(ttft, 2),
              "ttft_is": "a real prefill: a fresh prompt per request" if args.prompt == "random"
              else "a real prefill: the prefix cache off",
              "prefix_cache_hit_tokens": stats[0].totals.prefix_cache_hits, "ms_per_output_token": round(tpot, 3),
              "output_tokens_per_s": round(1e3 / tpot, 1), "tpot_ms_each": [round(r[1] * 1e3, 3) for r in runs[0]],
              "weight_stream": bound}
    print(f"one request, {prompt_len} prompt ({args.prompt}) + {args.output_len} output tokens, "
          f"{args.num_iters} runs (median):")
    print(f"  time to first token {ttft:.1f} ms; {tpot:.2f} ms per output token ({1e3 / tpot:.1f} tok/s)")
    one_per_step = tpot  # what a step that makes one token costs, for the bound's ratio
    if spec is not None:
        one_per_step = statistics.median(r[1] for r in runs[1]) * 1e3
        s = stats[0].totals
        kept = s.spec_num_accepted_tokens / max(1, s.spec_num_draft_tokens)
        per_step = 1 + s.spec_num_accepted_tokens / max(1, s.spec_num_drafts)
        result["speculative"] = {"config": msgspec.to_builtins(spec), "ms_per_output_token_without": round(one_per_step, 3),
                                 "speedup": round(one_per_step / tpot, 2), "proposals_kept": round(kept, 3),
                                 "tokens_per_verifying_step": round(per_step, 2)}
        print(f"  speculative decoding ({spec.method}): {100 * kept:.0f}% of proposals kept, {per_step:.2f} tokens "
              f"per verifying step; without it (the same requests in turn) {one_per_step:.2f} ms per output token: "
              f"{one_per_step / tpot:.2f}x fewer ms per token with it")
    if bound:
        bound["streamed_mb"] = round(bound["streamed_bytes"] / 1e6, 1)
        bound["one_token_step_over_bound"] = round(one_per_step / bound["bound_ms"], 2)
        print(f"  weight-streaming bound: {bound['streamed_mb']:.1f} MB of weights per step "
              f"(quantization: {bound['quantization']}) at {bound['bandwidth_gbs']:.1f} GB/s read = "
              f"{bound['bound_ms']:.2f} ms per one-token step; decoding one token per step runs at "
              f"{bound['one_token_step_over_bound']:.2f}x the bound" +
              (f", with speculation {tpot / bound['bound_ms']:.2f}x" if spec else ""))
    if args.output_json:
        write_result(args, result)
    return 0


def register(kinds, formatter) -> None:
    from common.cli.engine_args import add_engine_args

    p = kinds.add_parser("latency", help="ms per output token of one request at a time", formatter_class=formatter)
    add_engine_args(p)
    p.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"],
                   help="logging level")
    p.add_argument("--prompt", default="random", choices=["random", "copy-edit"],
                   help="random: --input-len random ids; copy-edit: an email the answer repeats with an edit")
    p.add_argument("--input-len", type=int, default=128, help="prompt tokens (random prompt)")
    p.add_argument("--output-len", type=int, default=128, help="output tokens")
    p.add_argument("--num-iters", type=int, default=5, help="timed requests (after one warm-up)")
    p.add_argument("--bench-seed", type=int, default=0, help="seed of the random prompts (one per request)")
    p.add_argument("--output-json", default=None, help="also write the figures here")
    p.set_defaults(func=run_latency)
