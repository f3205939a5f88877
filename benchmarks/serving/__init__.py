"""The HTTP side of the benchmarks: `nvllm bench serve` against any OpenAI-compatible server."""
