"""nvllm's benchmarks, above both services, beside their result files (results/): they may import common,
frontend and engine_core; none of those imports benchmarks, except the `nvllm` command line's one door
(frontend/cli/bench_door.py). By what the parts are:

- serving/    `nvllm bench serve`, an HTTP load generator for any OpenAI-compatible server
- offline/    throughput, overhead, latency, perplexity, llama.cpp: nvllm's engine driven in this process
- cpu/        `nvllm bench cpu`: the CPU workloads through nvllm and vLLM, back to back
- torch_side/ what builds or runs models with torch outside the engine (random models, baselines, kernel peaks)
- models/     the catalogue of real GGUF models and their fetching (common/model_fetch.py does the fetching)
- report/     `nvllm bench report`: the docs' performance pages, rendered from benchmarks/results/
"""
