"""A real Gemma 3 file as people download it (Gemma 3 270M, llama.cpp's Q4_K_M: Q4_K, Q5_0, Q6_K and Q8_0
tensors, tied embeddings, 18 layers of which every sixth is global, a 512-token window) runs through the whole
engine: its exact values (`--quantization none`) give transformers' greedy tokens, transformers reading the same
file with its own GGUF loader; kept quantized, it answers as the dequantized file but for near-ties. Prompts
longer than the window make the sliding layers slide. Needs the file in the cache (`nvllm bench models fetch
gemma-3-270m-q4_k_m`); skips, saying so, where it is not."""

import os

import pytest

from common.sampling_params import SamplingParams
from tests.support.near_ties import identical_but_for_near_ties
from tests.support.real_models import NEAR_TIE, cached_real_model

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NAME = "gemma-3-270m-q4_k_m"
WINDOW = 512  # the file's gemma3.attention.sliding_window
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time",
           "Count: " + ", ".join(str(i) for i in range(200))]  # about 800 tokens: past the window
TOKENS = 24


@pytest.fixture(scope="module")
def real_model() -> str:
    return cached_real_model(NAME)


def _generate(path: str, quantization: str):
    from frontend.offline.llm import LLM

    llm = LLM(path, multiprocess=False, dtype="float32", quantization=quantization, kv_cache_memory="512MiB",
              max_model_len=1024)
    try:
        params = SamplingParams(temperature=0, max_tokens=TOKENS, ignore_eos=True, logprobs=2)
        return llm.client.core.executor.runner.quantization, llm.generate(PROMPTS, params, use_tqdm=False)
    finally:
        llm.shutdown()


def test_the_file_runs_as_transformers_runs_it(real_model):
    import torch
    import transformers

    what, dense = _generate(real_model, "none")
    assert what == "none"
    assert len(dense[-1].prompt_token_ids) > WINDOW
    hf = transformers.AutoModelForCausalLM.from_pretrained(os.path.dirname(real_model),
                                                           gguf_file=os.path.basename(real_model),
                                                           dtype=torch.float32).eval()
    for out in dense:
        with torch.no_grad():
            theirs = hf.generate(torch.tensor([out.prompt_token_ids]), max_new_tokens=TOKENS,
                                 min_new_tokens=TOKENS, do_sample=False)
        assert out.outputs[0].token_ids == theirs[0, len(out.prompt_token_ids):].tolist(), out.prompt

    what, kept = _generate(real_model, "auto")
    assert "q4_k" in what and "q6_k" in what, what
    assert identical_but_for_near_ties([o.outputs[0] for o in kept], [o.outputs[0] for o in dense],
                                       NEAR_TIE) >= len(PROMPTS) // 2
