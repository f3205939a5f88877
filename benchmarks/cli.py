"""`nvllm bench ...`: the benchmarks' subcommands, in the order `nvllm bench --help` (and the CLI reference)
lists them. The frontend's command line calls register_commands through its one door into this package
(frontend/cli/bench_door.py); each subcommand imports its heavy parts only when it runs."""

from benchmarks import report
from benchmarks.cpu import suite as cpu_suite
from benchmarks.models import cli as models_cli
from benchmarks.offline import cli as offline_cli
from benchmarks.offline import latency, llama_cpp, perplexity
from benchmarks.serving import cli as serving_cli


def register_commands(sub, formatter) -> None:
    bench = sub.add_parser("bench", help="benchmarks", formatter_class=formatter)
    kinds = bench.add_subparsers(dest="bench_command", required=True)
    offline_cli.register_throughput(kinds, formatter)
    offline_cli.register_overhead(kinds, formatter)
    serving_cli.register(kinds, formatter)
    cpu_suite.register(kinds, formatter)
    latency.register(kinds, formatter)
    llama_cpp.register(kinds, formatter)
    perplexity.register(kinds, formatter)
    models_cli.register(kinds, formatter)
    report.register(kinds, formatter)
