"""`nvllm bench cpu`: the CPU workloads through nvllm and vLLM, each run a fresh child process."""
