"""Benchmarks that drive nvllm's engine from this process (LLM / AsyncLLM), no HTTP in between."""
