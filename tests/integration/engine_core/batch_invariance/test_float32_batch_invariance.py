"""Same request, same answer, in float32 on the CPU: a request's greedy tokens and logprobs are
bit-identical alone, in a batch with others, under a 16-token budget (chunked prefills, mixed steps),
after its prefix was cached, and after preemption and recomputation; on this machine's CPU tier and on the
avx2 and portable ones (NVLLM_CPU_ISA)."""

import pytest
import torch

from common.sampling_params import SamplingParams
from tests.support.cpu_tier_helpers import forced_tier, tier_params

pytestmark = pytest.mark.integration

MAX_TOKENS = 12


def _ids(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 49152, (n,), generator=g).tolist()


PROMPTS = [_ids(n, seed) for seed, n in enumerate((37, 5, 20, 64, 1, 33, 17, 48))]


def _answers(llm, prompts):
    """(tokens, per token {token id: (logprob, rank)} for the sampled and the top-1 token) of each prompt."""
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, logprobs=1, ignore_eos=True)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    answers = []
    for out in outputs:
        completion = out.outputs[0]
        logprobs = [{t: (lp.logprob, lp.rank) for t, lp in entry.items()} for entry in completion.logprobs]
        answers.append((list(completion.token_ids), logprobs))
    return answers


def _engine(model, **args):
    from frontend.llm import LLM
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
        alone = [_answers(plain, [p])[0] for p in PROMPTS]
        assert _answers(plain, PROMPTS) == alone  # all together
        assert _answers(plain, PROMPTS[::-1]) == alone[::-1]  # at other places in the batch
    finally:
        plain.shutdown()
    small_budget = _engine(model, enable_prefix_caching=True, max_num_batched_tokens=16, kv_cache_memory="16MiB")
    try:
        assert _answers(small_budget, PROMPTS) == alone  # prompts in chunks of up to 16 tokens beside decodes
        assert _answers(small_budget, PROMPTS) == alone  # again, their prefixes now in the cache
    finally:
        small_budget.shutdown()


def test_preemption_and_recomputation_change_nothing(tiny_models):
    model = tiny_models["llama"]
    roomy = _engine(model, enable_prefix_caching=False, kv_cache_memory="16MiB")
    try:
        alone = [_answers(roomy, [p])[0] for p in PROMPTS]
    finally:
        roomy.shutdown()
    # 8 blocks of 16 tokens for 8 requests that want 19 in all: two preemptions and recomputations
    per_block = 2 * 2 * 16 * 2 * 16 * 4  # layers, k and v, tokens, kv heads, head dim, float32
    tight = _engine(model, enable_prefix_caching=False, kv_cache_memory=8 * per_block, max_model_len=128)
    try:
        assert _answers(tight, PROMPTS) == alone
    finally:
        tight.shutdown()
