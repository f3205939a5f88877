"""The command lines of `nvllm bench throughput` and `nvllm bench overhead` (offline: the engine in this process
or a child, no HTTP); their runs import what they need when they start."""

from common.cli.arg_types import add_log_level
from common.cli.engine_args import add_engine_args
from common.random_models import RANDOM_MODELS


def register_throughput(kinds, formatter) -> None:
    tp = kinds.add_parser("throughput", help="offline throughput on random prompts", formatter_class=formatter)
    add_engine_args(tp)
    add_log_level(tp)
    tp.add_argument("--num-prompts", type=int, default=32, help="requests in the workload")
    tp.add_argument("--min-input-len", type=int, default=64, help="shortest prompt (tokens)")
    tp.add_argument("--max-input-len", type=int, default=512, help="longest prompt (tokens)")
    tp.add_argument("--min-output-len", type=int, default=64, help="shortest output (tokens)")
    tp.add_argument("--max-output-len", type=int, default=256, help="longest output (tokens)")
    tp.add_argument("--bench-seed", type=int, default=0, help="seed of the random workload")
    tp.add_argument("--backend", default="nvllm", choices=["nvllm", "hf"],
                    help="hf also runs the workload through transformers' batched generate and prints the ratio")
    tp.add_argument("--engine-mode", default="inproc", choices=["inproc", "mp", "both"],
                    help="core in this process, in a background process, or both one after the other (and their ratio)")
    tp.add_argument("--compare-batch-invariant", type=int, default=0, metavar="PAIRS",
                    help="run the workload PAIRS times with the batch-invariant kernels and with "
                         "--no-batch-invariant, alternating, and print the median ratio")
    tp.add_argument("--structured-share", type=float, default=0.0, metavar="SHARE",
                    help="this share of the requests (0-1) carries a JSON schema (benchmarks/offline/structured.py)")
    tp.add_argument("--compare-structured", type=int, default=0, metavar="PAIRS",
                    help="run the workload PAIRS times with --structured-share (default 0.5) and without, "
                         "alternating, and print the median ratio")
    tp.add_argument("--lora-adapters", type=int, default=0, metavar="N",
                    help="N random LoRA adapters (every projection targeted), the requests taking them in turn "
                         "(needs --enable-lora and --max-loras N)")
    tp.add_argument("--lora-rank", type=int, default=16, help="rank of the random adapters")
    tp.add_argument("--compare-lora", type=int, default=0, metavar="PAIRS",
                    help="run the workload PAIRS times with --lora-adapters (default 4) mixed, on the base model "
                         "(LoRA off) and on the base model with --enable-lora, alternating, and print the median ratios")
    tp.add_argument("--output-json", default=None, help="write the figures here")
    tp.add_argument("--random-model", default=None, choices=sorted(RANDOM_MODELS),
                    help="benchmark a random-weight model of this shape, one per family (common/random_models.py; "
                         "written once into the model cache) "
                         "instead of a model folder. nano-vllm's GPU workload: --random-model qwen3-0.6b "
                         "--num-prompts 256 --min-input-len 100 --max-input-len 1024 --min-output-len 100 "
                         "--max-output-len 1024")

    def run(args):
        from benchmarks.offline.throughput import run_throughput
        return run_throughput(args)

    tp.set_defaults(func=run)


def register_overhead(kinds, formatter) -> None:
    oh = kinds.add_parser("overhead", help="tiny requests per second through frontend and core",
                          formatter_class=formatter)
    add_engine_args(oh)
    add_log_level(oh)
    oh.add_argument("--num-requests", type=int, default=2000, help="requests to send")
    oh.add_argument("--concurrency", type=int, default=64, help="requests in flight at once")
    oh.add_argument("--max-tokens", type=int, default=1, help="tokens each request generates")
    oh.add_argument("--compare-tracing", type=int, default=0, metavar="ROUNDS",
                    help="run the workload ROUNDS times each with tracing off, to a dead collector and to a live "
                         "OTLP/HTTP one, alternating, and print the median ratios (benchmarks/offline/tracing_cost.py)")
    oh.add_argument("--output-json", default=None, help="write the figures here")

    def run_oh(args):
        if args.compare_tracing:
            from benchmarks.offline.tracing_cost import run_compare_tracing
            return run_compare_tracing(args)
        from benchmarks.offline.overhead import run_overhead
        return run_overhead(args)

    oh.set_defaults(func=run_oh)
