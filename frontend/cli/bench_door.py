"""The frontend's one door into the benchmarks package (benchmarks/, beside frontend/ and engine_core/):
`nvllm bench ...` exists where that package is installed. The frontend image leaves it out (it carries none of
the benchmarks' torch side), and there `nvllm` simply has no bench command. import-linter lets no other frontend
module import benchmarks (the contracts in pyproject.toml)."""

import importlib.util


def _benchmarks_installed() -> bool:
    # a checkout's benchmarks/ always holds the result files; the commands are there only with the code
    try:
        return importlib.util.find_spec("benchmarks.cli") is not None
    except ModuleNotFoundError:  # no benchmarks package at all (the frontend image)
        return False


def register_bench_commands(sub, formatter) -> None:
    if not _benchmarks_installed():
        return
    from benchmarks.cli import register_commands
    register_commands(sub, formatter)
