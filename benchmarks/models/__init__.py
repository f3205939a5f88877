"""The real GGUF models benchmarks use: the catalogue, fetching and verifying them, `nvllm bench models`."""
