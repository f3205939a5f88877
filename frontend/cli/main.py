"""`nvllm` command line: serve, engine-core, frontend, bench."""

import argparse
import logging
import sys

from common import hugepages
from frontend.cli import commands


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # a bad flag is one line, not the whole usage
        self.exit(2, f"{self.prog}: error: {message} (see: {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="nvllm", description="nvllm: LLM serving engine",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for register in commands.REGISTRY:
        register(sub)
    return parser


# subcommands that run the model in their own process (serve's core is a child, given the tunable)
RUNS_THE_MODEL = {("engine-core", None), ("worker", None), ("bench", "throughput")}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # result files record the command that made them
    runs_model = (args.command, getattr(args, "bench_command", None)) in RUNS_THE_MODEL and not getattr(args, "check", False)
    if argv is None and runs_model:
        hugepages.restart_with_tunable()  # the command line itself, not a caller's main([...])
    logging.basicConfig(level=getattr(args, "log_level", "INFO").upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args) or 0
    except (ValueError, FileNotFoundError) as e:
        # bad input is a message, not a traceback
        print(f"nvllm {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
