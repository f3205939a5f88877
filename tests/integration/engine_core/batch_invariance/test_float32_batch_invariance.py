"""Same request, same answer, in float32 on the CPU: a request's greedy tokens and logprobs are
bit-identical alone, in a batch with others, under a 16-token budget (chunked prefills, mixed steps),
after its prefix was cached, and after preemption and recomputation; on this machine's CPU tier and on the
avx2 and portable ones (NVLLM_CPU_ISA)."""

import pytest

from tests.support.cpu_tier_helpers import forced_tier, tier_params
from tests.support.greedy_answers import PROMPTS, greedy_answers

pytestmark = pytest.mark.integration

def _engine(model, **args):
    from frontend.offline.llm import LLM
    return LLM(model, multiprocess=False, dtype="float32", **({"max_model_len": 256} | args))


@pytest.fixture(params=tier_params("own", "avx2", "portable"))
def cpu_tier(request):
    with forced_tier(request.param):
        yield request.param


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_a_request_answers_the_same_whatever_runs_beside_it(tiny_models, arch, cpu_tier):
    model = tiny_models[arch]
    plain = _engine(model, enable_prefix_caching=False, kv_cache_memory="16MiB")
    try:
        alone = [greedy_answers(plain, [p])[0] for p in PROMPTS]
        assert greedy_answers(plain, PROMPTS) == alone  # all together
        assert greedy_answers(plain, PROMPTS[::-1]) == alone[::-1]  # at other places in the batch
    finally:
        plain.shutdown()
    small_budget = _engine(model, enable_prefix_caching=True, max_num_batched_tokens=16, kv_cache_memory="16MiB")
    try:
        assert greedy_answers(small_budget, PROMPTS) == alone  # prompts in chunks of up to 16 tokens beside decodes
        assert greedy_answers(small_budget, PROMPTS) == alone  # again, their prefixes now in the cache
    finally:
        small_budget.shutdown()


def test_preemption_and_recomputation_change_nothing(tiny_models):
    model = tiny_models["llama"]
    roomy = _engine(model, enable_prefix_caching=False, kv_cache_memory="16MiB")
    try:
        alone = [greedy_answers(roomy, [p])[0] for p in PROMPTS]
    finally:
        roomy.shutdown()
    # 8 blocks of 16 tokens for 8 requests that want 19 in all: two preemptions and recomputations
    per_block = 2 * 2 * 16 * 2 * 16 * 4  # layers, k and v, tokens, kv heads, head dim, float32
    tight = _engine(model, enable_prefix_caching=False, kv_cache_memory=8 * per_block, max_model_len=128)
    try:
        assert greedy_answers(tight, PROMPTS) == alone
    finally:
        tight.shutdown()
