"""`nvllm bench latency`: time per output token for one request at a time, what one chatting user feels.

One request of `--input-len` random prompt tokens (seeded) asks for `--output-len` tokens, EOS ignored,
greedy, streamed token by token through AsyncLLM (engine core in its own process, as `nvllm serve` runs
it), `--num-iters` times after one warm-up. Per request: time to first token, and ms per output token
after it (the last token's time minus the first's, over the tokens between). Medians are printed with
the weight-streaming bound of this model on this machine, measured in the same run
(engine_core/weight_stream.py, in a child: the frontend does not import torch), and how far above it
the engine runs.

`--prompt copy-edit` sends a fixed text instead, which the answer repeats with an edit (the case prompt
lookup is made for). With `--speculative-config`, the same requests also run on an engine without it,
in the same run, and the ratio of ms per output token is printed with the share of proposals kept.
"""

import asyncio
import json
import os
import random
import statistics
import sys
import time

import msgspec

from common.sampling_params import RequestOutputKind, SamplingParams


def weight_stream_bound(args) -> dict | None:
    """The child's figures, or None on devices it does not measure (a GPU)."""
    from frontend.bench.cpu_suite import ROOT, _run_child

    if args.device == "cuda":
        return None
    cmd = [sys.executable, "-m", "engine_core.weight_stream", "--quantization", args.quantization, "--dtype",
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


def _prompt(args) -> tuple[str | None, list[int] | None]:
    """(text, token ids): one of them."""
    if args.prompt == "copy-edit":
        return COPY_EDIT_PROMPT, None
    rng = random.Random(args.bench_seed)
    return None, [rng.randrange(100, 10000) for _ in range(args.input_len)]


async def _measure(engine_args, args) -> tuple[list[tuple[float, float]], int, object]:
    """(ttft, ms per token) of each timed request, the prompt's length, and the core's stats after."""
    from frontend.async_llm import AsyncLLM

    engine = await AsyncLLM.create(engine_args)
    try:
        text, token_ids = _prompt(args)
        params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True,
                                output_kind=RequestOutputKind.DELTA)
        runs, prompt_len = [], 0
        for i in range(args.num_iters + 1):
            start = time.perf_counter()
            times = []
            async for out in engine.generate(text, params, f"latency-{i}", prompt_token_ids=token_ids):
                now = time.perf_counter()
                times += [now] * len(out.outputs[0].token_ids)
                prompt_len = len(out.prompt_token_ids or ())
            if i:  # the first warms the engine up
                runs.append((times[0] - start, (times[-1] - times[0]) / max(1, len(times) - 1)))
        return runs, prompt_len, await engine.get_stats()
    finally:
        engine.shutdown()


def run_latency(args) -> int:
    from frontend.cli.engine_args import engine_args_from

    bound = weight_stream_bound(args)
    engine_args = engine_args_from(args)
    runs, prompt_len, stats = asyncio.run(_measure(engine_args, args))
    ttft = statistics.median(r[0] for r in runs) * 1e3
    tpot = statistics.median(r[1] for r in runs) * 1e3
    result = {"prompt": args.prompt, "input_len": prompt_len, "output_len": args.output_len,
              "iterations": args.num_iters, "ttft_ms": round(ttft, 2), "ms_per_output_token": round(tpot, 3),
              "output_tokens_per_s": round(1e3 / tpot, 1), "tpot_ms_each": [round(r[1] * 1e3, 3) for r in runs],
              "weight_stream": bound}
    print(f"one request, {prompt_len} prompt ({args.prompt}) + {args.output_len} output tokens, "
          f"{args.num_iters} runs (median):")
    print(f"  time to first token {ttft:.1f} ms; {tpot:.2f} ms per output token ({1e3 / tpot:.1f} tok/s)")
    if engine_args.speculative_config is not None:
        plain_args = msgspec.structs.replace(engine_args, speculative_config=None)
        plain_runs, _, _ = asyncio.run(_measure(plain_args, args))
        plain = statistics.median(r[1] for r in plain_runs) * 1e3
        kept = stats.spec_num_accepted_tokens / max(1, stats.spec_num_draft_tokens)
        per_step = 1 + stats.spec_num_accepted_tokens / max(1, stats.spec_num_drafts)
        result["speculative"] = {"config": msgspec.to_builtins(engine_args.speculative_config),
                                 "ms_per_output_token_without": round(plain, 3), "speedup": round(plain / tpot, 2),
                                 "proposals_kept": round(kept, 3), "tokens_per_verifying_step": round(per_step, 2)}
        print(f"  speculative decoding ({engine_args.speculative_config.method}): {100 * kept:.0f}% of proposals "
              f"kept, {per_step:.2f} tokens per verifying step; without it {plain:.2f} ms per output token: "
              f"{plain / tpot:.2f}x fewer ms per token with it")
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
    p.add_argument("--prompt", default="random", choices=["random", "copy-edit"],
                   help="random: --input-len random ids; copy-edit: an email the answer repeats with an edit")
    p.add_argument("--input-len", type=int, default=128, help="prompt tokens (random prompt)")
    p.add_argument("--output-len", type=int, default=128, help="output tokens")
    p.add_argument("--num-iters", type=int, default=5, help="timed requests (after one warm-up)")
    p.add_argument("--bench-seed", type=int, default=0, help="seed of the random prompt")
    p.add_argument("--output-json", default=None, help="also write the figures here")
    p.set_defaults(func=run_latency)
