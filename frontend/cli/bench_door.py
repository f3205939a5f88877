"""The frontend's one door into the bench package (bench/, beside frontend/ and engine_core/): `nvllm bench ...`
exists where bench is installed. The frontend image leaves bench out (it carries none of the benchmarks' torch
side), and there `nvllm` simply has no bench command. import-linter lets no other frontend module import bench
(the contracts in pyproject.toml)."""


def register_bench_commands(sub, formatter) -> None:
    try:
        import bench  # noqa: F401
    except ImportError:
        return
    from bench.cli import register_commands
    register_commands(sub, formatter)
