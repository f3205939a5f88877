"""`nvllm bench llama-cpp MODEL.gguf --llama-bench PATH`: nvllm and llama.cpp on the same GGUF file, the same
threads, in one sitting, alternated round by round (a shared machine's slow spells weigh on both alike).

Each round runs llama.cpp's own `llama-bench -p INPUT -n OUTPUT -t THREADS -r 3 -o json` (prompt processing:
one prompt of INPUT tokens; generation: OUTPUT tokens after an empty context), then nvllm's `bench latency`
measurement (a fresh random prompt of INPUT tokens per request, so the time to first token is a real prefill,
then OUTPUT tokens, greedy, EOS ignored, the engine core in its own process). Printed and written: per round
and as medians, llama.cpp's pp and tg tok/s, nvllm's prefill tok/s (INPUT / time to first token) and decode
tok/s (1 / ms per output token), and nvllm over llama.cpp for each (above 1: nvllm faster).
"""

import argparse
import asyncio
import json
import os
import shlex
import statistics
import subprocess

from benchmarks.result_file import write_result


def _llama_bench(args) -> dict:
    """llama.cpp's pp and tg tok/s (the means over its repetitions) for this round."""
    cmd = [args.llama_bench, "-m", args.model, "-p", str(args.input_len), "-n", str(args.output_len), "-t",
           str(args.threads), "-r", str(args.llama_repetitions), "-o", "json", *shlex.split(args.llama_bench_args)]
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(os.path.abspath(args.llama_bench)))
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
    if out.returncode:
        raise SystemExit(f"llama-bench failed (exit {out.returncode}): {' '.join(cmd)}\n{out.stderr[-2000:]}")
    rows = json.loads(out.stdout)
    pp = next(r["avg_ts"] for r in rows if r["n_prompt"] and not r["n_gen"])
    tg = next(r["avg_ts"] for r in rows if r["n_gen"] and not r["n_prompt"])
    return {"pp_tok_s": round(pp, 2), "tg_tok_s": round(tg, 2), "tg_ms_per_token": round(1e3 / tg, 3)}


def _nvllm(engine_args, args, round_index: int) -> dict:
    """nvllm's prefill and decode rates for this round (benchmarks/offline/latency.py's measurement)."""
    from benchmarks.offline.latency import _measure

    latency_args = argparse.Namespace(prompt="random", input_len=args.input_len, output_len=args.output_len,
                                      num_iters=args.num_iters, bench_seed=1000 + round_index)
    runs, _, _ = asyncio.run(_measure([engine_args], latency_args))
    ttft = statistics.median(r[0] for r in runs[0])
    tpot = statistics.median(r[1] for r in runs[0])
    return {"prefill_tok_s": round(args.input_len / ttft, 2), "ttft_ms": round(ttft * 1e3, 1),
            "decode_tok_s": round(1 / tpot, 2), "ms_per_output_token": round(tpot * 1e3, 3)}


def run_llama_cpp(args) -> int:
    from common.cli.engine_args import engine_args_from

    if not args.model or not args.model.endswith(".gguf"):
        raise SystemExit("nvllm bench llama-cpp: MODEL must be a .gguf file (llama.cpp and nvllm read the same file)")
    if not os.access(args.llama_bench, os.X_OK):
        raise SystemExit(f"nvllm bench llama-cpp: --llama-bench {args.llama_bench} is not an executable llama-bench")
    engine_args = engine_args_from(args)
    engine_args.cpu_threads = args.threads
    rounds = []
    for i in range(args.rounds):
        llama = _llama_bench(args)
        ours = _nvllm(engine_args, args, i)
        rounds.append({"llama_cpp": llama, "nvllm": ours})
        print(f"round {i + 1}: llama.cpp pp{args.input_len} {llama['pp_tok_s']:.1f} tok/s, tg{args.output_len} "
              f"{llama['tg_tok_s']:.2f} tok/s ({llama['tg_ms_per_token']:.1f} ms); nvllm prefill "
              f"{ours['prefill_tok_s']:.1f} tok/s, decode {ours['decode_tok_s']:.2f} tok/s "
              f"({ours['ms_per_output_token']:.1f} ms)", flush=True)

    def median(side: str, key: str) -> float:
        return round(statistics.median(r[side][key] for r in rounds), 2)

    summary = {"llama_cpp_pp_tok_s": median("llama_cpp", "pp_tok_s"),
               "llama_cpp_tg_tok_s": median("llama_cpp", "tg_tok_s"),
               "nvllm_prefill_tok_s": median("nvllm", "prefill_tok_s"),
               "nvllm_decode_tok_s": median("nvllm", "decode_tok_s")}
    summary["prefill_nvllm_over_llama_cpp"] = round(summary["nvllm_prefill_tok_s"] / summary["llama_cpp_pp_tok_s"], 2)
    summary["decode_nvllm_over_llama_cpp"] = round(summary["nvllm_decode_tok_s"] / summary["llama_cpp_tg_tok_s"], 2)
    print(f"median of {args.rounds} rounds: prefill {summary['prefill_nvllm_over_llama_cpp']:.2f}x llama.cpp's, "
          f"decode {summary['decode_nvllm_over_llama_cpp']:.2f}x llama.cpp's (above 1: nvllm faster)")
    if args.output_json:
        write_result(args, {"input_len": args.input_len, "output_len": args.output_len, "threads": args.threads,
                            "llama_bench": os.path.abspath(args.llama_bench),
                            "llama_bench_args": args.llama_bench_args, "rounds": rounds, **summary})
    return 0


def register(kinds, formatter) -> None:
    from common.cli.engine_args import add_engine_args

    p = kinds.add_parser("llama-cpp", help="nvllm against llama.cpp's llama-bench on the same GGUF, alternated",
                         formatter_class=formatter)
    add_engine_args(p)
    p.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"],
                   help="logging level")
    p.add_argument("--llama-bench", required=True, help="path of a llama-bench built from llama.cpp's source")
    p.add_argument("--llama-bench-args", default="", help="more llama-bench arguments, e.g. '--repack 0'")
    p.add_argument("--llama-repetitions", type=int, default=3, help="llama-bench's -r")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="threads, both engines")
    p.add_argument("--input-len", type=int, default=512, help="prompt tokens (llama-bench -p)")
    p.add_argument("--output-len", type=int, default=128, help="output tokens (llama-bench -n)")
    p.add_argument("--num-iters", type=int, default=3, help="nvllm's timed requests per round")
    p.add_argument("--rounds", type=int, default=2, help="rounds, each llama.cpp then nvllm")
    p.add_argument("--timeout", type=int, default=1800, help="seconds one llama-bench run may take")
    p.add_argument("--output-json", default=None, help="also write the figures here")
    p.set_defaults(func=run_llama_cpp)
