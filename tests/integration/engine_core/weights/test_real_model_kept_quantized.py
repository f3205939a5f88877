"""A real Q4_K_M file kept quantized (Qwen2.5-Coder-0.5B-Instruct: Q5_0, Q8_0, Q4_K and Q6_K tensors, fused layers
of mixed types) answers as the same file dequantized: the float32 engine keeps every layer (quant_int8_rows.c rounds
each activation row to 8 bits per block, llama.cpp's numerics), the reference runs the file's exact values
(`--quantization none`). Greedy tokens agree but where the two part at a near-tie: both rank the same two tokens
first, at most NEAR_TIE apart. Needs the file in the cache (`nvllm bench models fetch
qwen2.5-coder-0.5b-instruct-q4_k_m`); skips, saying so, where it is not."""

import os

import pytest

from common.sampling_params import SamplingParams
from tests.support.near_ties import identical_but_for_near_ties
from tests.support.real_models import NEAR_TIE, cached_real_model

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NAME = "qwen2.5-coder-0.5b-instruct-q4_k_m"
PROMPTS = ["Write a Python function that reverses a string.", "What does HTTP 404 mean?",
           "Explain a hash map in one sentence.", "Write a SQL query that counts the rows of a table named users.",
           "What is the time complexity of binary search?", "Name three sorting algorithms."]


@pytest.fixture(scope="module")
def real_model() -> str:
    return cached_real_model(NAME)


def _answers(path: str, quantization: str):
    from frontend.offline.llm import LLM

    llm = LLM(path, multiprocess=False, dtype="float32", quantization=quantization, kv_cache_memory="256MiB",
              max_model_len=512, enable_prefix_caching=False)
    try:
        params = SamplingParams(temperature=0, max_tokens=24, logprobs=2)
        outs = llm.chat([[{"role": "user", "content": p}] for p in PROMPTS], params, use_tqdm=False)
        return llm.client.core.executor.runner.quantization, [o.outputs[0] for o in outs]
    finally:
        llm.shutdown()


def test_the_kept_file_answers_as_the_dequantized_file_but_for_near_ties(real_model):
    what, kept = _answers(real_model, "auto")
    assert "q4_k" in what and "q6_k" in what and "q5_0+q8_0" in what, what  # every layer kept, pieces too
    what, dense = _answers(real_model, "none")
    assert what == "none"
    assert identical_but_for_near_ties(kept, dense, NEAR_TIE) >= len(PROMPTS) // 2
    assert os.path.getsize(real_model) == 491400064
