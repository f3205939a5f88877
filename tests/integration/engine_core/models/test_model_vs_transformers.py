"""Our models' logits equal transformers' (float32) through every path of the paged KV cache."""

import pytest
import torch
import transformers

from tests.support.cpu_tier_helpers import forced_tier, tier_params
from tests.support.paged_kv_logits import (TOKENS, check_chunked_prefill, check_decode_after_prefill,
                                           check_prefill, check_prefix_hit_and_mixed_batch, make_runner)
from tests.support.preemption_check import assert_greedy_under_preemption

pytestmark = pytest.mark.integration

@pytest.fixture(scope="module", params=tier_params("own", "avx2", "portable"))
def tier(request):
    """Every comparison on this machine's CPU tier and, forced (NVLLM_CPU_ISA), on the AVX2 and portable ones."""
    with forced_tier(request.param):
        yield request.param


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3"])
def pair(request, tiny_models, tier):
    path = tiny_models[request.param]
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    return make_runner(path), hf


def test_prefill(pair):
    check_prefill(pair)


def test_decode_after_prefill(pair):
    check_decode_after_prefill(pair)


def test_chunked_prefill(pair):
    check_chunked_prefill(pair)


def test_prefix_hit_and_mixed_batch(pair):
    check_prefix_hit_and_mixed_batch(pair)


PREEMPTED_PROMPTS = [TOKENS[:9], TOKENS[3:20], TOKENS[5:11], TOKENS[:17]]


@pytest.mark.parametrize("cpu_tier", tier_params("own", "avx2", "portable"))
def test_greedy_generate_with_preemption_matches(tiny_models, cpu_tier):
    """Through the whole engine: 24 blocks of 4 tokens, so the four requests (up to 17 + 24 tokens each) cannot
    all stay resident and get preempted and recomputed; greedy tokens still equal transformers' generate."""
    with forced_tier(cpu_tier):  # the engine process inherits NVLLM_CPU_ISA
        assert_greedy_under_preemption(tiny_models["llama"], PREEMPTED_PROMPTS, blocks=24)


def test_qwen3_greedy_generate_with_preemption_matches(tiny_models):
    assert_greedy_under_preemption(tiny_models["qwen3"], PREEMPTED_PROMPTS, blocks=24)
