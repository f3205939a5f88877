"""One offline workload through one engine, in this process; prints one JSON line of figures.

Run by `nvllm bench cpu` in a fresh child process per run, with the Python of the engine under test:
the project's for nvllm, a vLLM CPU venv's for vLLM (this file imports nothing of the project at the
top level, so it runs there as a plain script):

    python -m benchmarks.cpu.workloads nvllm w32 [--num-prompts=N] [KEY=VALUE ...]
    VENV/bin/python benchmarks/cpu/workloads.py vllm w32 MODEL_DIR [--num-prompts=N] [--vllm-dtype=DTYPE]

Workloads (random token ids, seeded, greedy, EOS ignored, max_model_len 2048; vLLM in bfloat16 unless
--vllm-dtype says otherwise (float32 is its faster choice on a CPU without AVX512-BF16), nvllm in the
dtype `--dtype auto` picks on the CPU tier: bfloat16 on avx512_bf16 and amx, float32 below):
  w32      32 prompts of 64-512 tokens, 64-256 output tokens each (../shared/tools/w32.py's W32);
           the figure is output tok/s
  prefill  32 prompts of 256-512 tokens, 1 output token each; the figure is prompt tok/s
  decode   32 prompts of 8 tokens, 256 output tokens each; the figure is output tok/s
"""

import json
import os
import random
import sys
import time

WORKLOADS = ("w32", "prefill", "decode")
NUM_PROMPTS = "--num-prompts="  # the first N requests of a workload (a quicker run)
VLLM_DTYPE = "--vllm-dtype="


def workload(name: str, count: int | None = None) -> tuple[list[list[int]], list[int]]:
    """(prompts as token ids, output lengths): the first `count` of the workload's requests (all: None)."""
    prompts, outputs = _requests(name)
    return prompts[:count], outputs[:count]


def _requests(name: str) -> tuple[list[list[int]], list[int]]:
    if name == "w32":
        r = random.Random(0)
        prompts = [[r.randrange(200, 40000) for _ in range(r.randint(64, 512))] for _ in range(32)]
        return prompts, [r.randint(64, 256) for _ in range(32)]
    if name == "prefill":
        r = random.Random(1)
        return [[r.randrange(200, 40000) for _ in range(r.randint(256, 512))] for _ in range(32)], [1] * 32
    if name == "decode":
        r = random.Random(2)
        return [[r.randrange(200, 40000) for _ in range(8)] for _ in range(32)], [256] * 32
    raise ValueError(f"workload {name!r} is not one of {', '.join(WORKLOADS)}")


def figures(name: str, prompts, outputs: list[int], seconds: float) -> dict:
    prompt_tokens, output_tokens = sum(map(len, prompts)), sum(outputs)
    rate = (prompt_tokens if name == "prefill" else output_tokens) / seconds
    return {"workload": name, "requests": len(prompts), "seconds": round(seconds, 3), "prompt_tokens": prompt_tokens,
            "output_tokens": output_tokens, "tok_s": round(rate, 1),
            "unit": "prompt tok/s" if name == "prefill" else "output tok/s"}


def run_nvllm(name: str, engine_args: dict, count: int | None = None) -> dict:
    from frontend import LLM, SamplingParams

    llm = LLM(dtype="auto", max_model_len=2048, **engine_args)
    prompts, outs = workload(name, count)
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in outs]
    llm.generate([[1, 2, 3]], SamplingParams(max_tokens=4), use_tqdm=False)
    start = time.perf_counter()
    results = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    llm.shutdown()
    got = [len(r.outputs[0].token_ids) for r in results]
    assert got == outs, "nvllm returned other output lengths than asked for"
    return figures(name, prompts, got, seconds)


def run_vllm(name: str, model_dir: str, count: int | None = None, dtype: str = "bfloat16") -> dict:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    # vLLM keeps one core for its API server by default; offline, give it every core, as nvllm has
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{os.cpu_count() - 1}")
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=model_dir, dtype=dtype, max_model_len=2048, seed=0)
    prompts, outs = workload(name, count)
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in outs]
    llm.generate([TokensPrompt(prompt_token_ids=[1, 2, 3])], SamplingParams(max_tokens=4), use_tqdm=False)
    start = time.perf_counter()
    results = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    seconds = time.perf_counter() - start
    got = [len(r.outputs[0].token_ids) for r in results]
    assert got == outs, "vLLM returned other output lengths than asked for"
    return figures(name, prompts, got, seconds)


def _value(text: str):
    """An engine argument from KEY=VALUE: JSON where it parses (numbers, true/false), else the text."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def main(argv: list[str]) -> int:
    counts = [int(a.split("=", 1)[1]) for a in argv if a.startswith(NUM_PROMPTS)]
    dtypes = [a.split("=", 1)[1] for a in argv if a.startswith(VLLM_DTYPE)]
    argv = [a for a in argv if not a.startswith((NUM_PROMPTS, VLLM_DTYPE))]
    engine, name, count = argv[0], argv[1], counts[-1] if counts else None
    if engine == "nvllm":
        result = run_nvllm(name, {k: _value(v) for k, v in (a.split("=", 1) for a in argv[2:])}, count)
    else:
        result = run_vllm(name, argv[2], count, *dtypes[-1:])
    print("RESULT " + json.dumps(result | {"engine": engine}), flush=True)
    return 0


if __name__ == "__main__":  # vLLM starts its engine with spawn: keep the guard
    sys.exit(main(sys.argv[1:]))
