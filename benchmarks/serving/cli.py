"""`nvllm bench serve`'s command line (the load generator itself is benchmarks/serving/serve.py)."""

import argparse

from common.cli.arg_types import add_log_level, number, positive_int


def register(kinds, formatter) -> None:
    """`nvllm bench serve`, under `nvllm bench`."""
    p = kinds.add_parser("serve", help="HTTP load test of an OpenAI-compatible server", formatter_class=formatter)
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="the server, without /v1")
    p.add_argument("--endpoint", default="/v1/completions", help="completions endpoint path")
    p.add_argument("--model", default=None, help="model name to send (default: the first of /v1/models)")
    p.add_argument("--api-key", default=argparse.SUPPRESS,
                   help="bearer key to send (default: $OPENAI_API_KEY, else $NVLLM_API_KEY, else none)")
    p.add_argument("--num-prompts", type=positive_int, default=64, help="requests to send")
    p.add_argument("--max-concurrency", type=positive_int, default=None,
                   help="most requests in flight at once (default: no limit)")
    p.add_argument("--request-rate", type=_rate, default=float("inf"),
                   help="mean requests per second, Poisson arrivals (inf: all at once)")
    p.add_argument("--random-input-len", type=positive_int, default=128, help="prompt length in tokens")
    p.add_argument("--random-output-len", type=positive_int, default=64, help="output length in tokens")
    p.add_argument("--random-range-ratio", type=_ratio, default=0.0,
                   help="lengths are uniform in [L(1-r), L(1+r)]; 0: fixed lengths")
    p.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True,
                   help="ask the server to generate every requested token (vLLM's ignore_eos)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random workload")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds one request may take")
    p.add_argument("--output-json", default=None, help="also write the figures here as JSON")
    add_log_level(p)

    def run(ns):
        from benchmarks.serving.serve import run_bench_serve
        return run_bench_serve(ns)

    p.set_defaults(func=run)


def _rate(text: str) -> float:
    value = number(float, text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 (or inf), got {text}")
    return value


def _ratio(text: str) -> float:
    value = number(float, text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {value}")
    return value
