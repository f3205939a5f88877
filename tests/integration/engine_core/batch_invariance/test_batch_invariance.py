"""Same request, same answer: a request's greedy tokens, their logprobs (bit for bit) and its seeded
samples depend on that request alone. Hypothesis draws what else runs with it (other requests of random
lengths, some sharing its prefix, at random places in the batch); each engine adds one way a step's shape
changes: token budgets of 16, 32 and 2048 (chunked prefill), a warm prefix cache, a KV cache small
enough that requests are preempted and recomputed. Checked on the default model and on tiny random
Llama and Qwen3 models, in bfloat16 (the AVX512-BF16 kernels) and float32 (the generic fixed-order
kernels); and shown to fail with --no-batch-invariant."""

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.sampling_params import SamplingParams
from tests.support.tiny_models import build_tiny_model, kv_block_bytes

pytestmark = pytest.mark.integration

GREEDY = SamplingParams(temperature=0, max_tokens=12, logprobs=2, ignore_eos=True)
SEEDED = SamplingParams(temperature=0.9, top_p=0.95, seed=1234, max_tokens=12, logprobs=1, ignore_eos=True)
# budgets and KV sizes of the engines (blocks of 16 tokens; the small one preempts)
ENGINES = {
    "budget-2048-prefix-cache": dict(max_num_batched_tokens=2048, enable_prefix_caching=True),
    "budget-16-prefix-cache": dict(max_num_batched_tokens=16, enable_prefix_caching=True),
    "budget-32-preempting": dict(max_num_batched_tokens=32, enable_prefix_caching=False, kv_blocks=14,
                                 max_model_len=160),
    # verified proposals are computed as rows of a chunk: a kept token and its logprobs must be plain
    # decoding's bit for bit (seeded samples differ by design: verification draws its own uniforms)
    "budget-48-ngram-speculation": dict(max_num_batched_tokens=48, enable_prefix_caching=True,
                                        speculative_config={"method": "ngram", "num_speculative_tokens": 3,
                                                            "prompt_lookup_max": 2}),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory, default_model_dir):
    """Tiny random models whose head dims the C attention kernels take (multiples of 32)."""
    root = tmp_path_factory.mktemp("invariance")
    return {"default": default_model_dir,
            "llama": build_tiny_model(str(root / "llama"), "llama", default_model_dir, head_dim=32),
            "qwen3": build_tiny_model(str(root / "qwen3"), "qwen3", default_model_dir)}


def _targets(seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, 10000) for _ in range(n)] for n in (7, 29, 50)]


def _kept_proposal(prompt: list[int], output: tuple[int, ...]) -> bool:
    """Whether n-gram speculation (ENGINES' lookup of 2 down to 1 tokens) keeps a proposal while this greedy
    output is generated: at a step with room for one (a proposal and the step's own token before
    max_tokens), what followed the sequence's suffix earlier is the next token again."""
    from engine_core.spec_decode.ngram import NgramProposer

    lookup = NgramProposer(1, 2)
    for i in range(len(output) - 2):
        proposed = lookup.propose(list(prompt) + list(output[:i + 1]), 1)
        if proposed == [output[i + 1]]:
            return True
    return False


def _speculating_target(llm, seed: int) -> list[int]:
    """A prompt of random ids (a phrase repeated) on whose greedy output n-gram speculation keeps proposals
    on this model, found by trying seeds on a plain engine: the speculating engine then verifies and keeps
    proposals whatever Hypothesis draws beside the targets."""
    for attempt in range(64):
        rng = random.Random(seed * 1000 + attempt)
        phrase = [rng.randrange(100, 10000) for _ in range(rng.randint(3, 12))]
        prompt = (phrase * 8)[: rng.randint(20, 60)]
        output = _results(llm.generate([prompt], [GREEDY], use_tqdm=False))[0][0]
        if _kept_proposal(prompt, output):
            return prompt
    pytest.fail("none of 64 prompts makes this model repeat itself: n-gram speculation would propose nothing")


def _llm(model: str, dtype: str, max_num_batched_tokens: int, enable_prefix_caching: bool, kv_blocks: int | None = None,
         max_model_len: int = 256, **extra):
    from frontend.offline.llm import LLM
    kv = None
    if kv_blocks is not None:
        from engine_core.engine_config import ModelConfig
        facts = ModelConfig.from_folder(model).hf_config
        head_dim = facts.get("head_dim") or facts["hidden_size"] // facts["num_attention_heads"]
        kv = kv_blocks * kv_block_bytes(facts["num_hidden_layers"], facts["num_key_value_heads"], head_dim, dtype)
    return LLM(model, multiprocess=False, dtype=dtype, max_model_len=max_model_len, max_num_seqs=8,
               max_num_batched_tokens=max_num_batched_tokens, enable_prefix_caching=enable_prefix_caching,
               kv_cache_memory=kv, **extra)


def _results(outputs) -> list[tuple]:
    """(tokens, each token's logprob, the top logprobs) per request: compared bit for bit."""
    return [(tuple(o.outputs[0].token_ids),
             tuple(lp[t].logprob for lp, t in zip(o.outputs[0].logprobs or [], o.outputs[0].token_ids)),
             tuple(tuple(sorted((i, x.logprob) for i, x in lp.items())) for lp in o.outputs[0].logprobs or []))
            for o in outputs]


def _alone(llm, targets) -> list[tuple]:
    """Each target request by itself, greedy and seeded."""
    return [_results(llm.generate([t], [params], use_tqdm=False))[0] for t in targets for params in (GREEDY, SEEDED)]


@st.composite
def compositions(draw, num_targets: int):
    """Other requests (random lengths, some starting with a target's prefix, random outputs and sampling)
    with the targets put at random places among them."""
    others = []
    for _ in range(draw(st.integers(0, 5))):
        length = draw(st.integers(1, 90))
        seed = draw(st.integers(0, 2**16))
        rng = random.Random(seed)
        prefix_of = draw(st.none() | st.integers(0, num_targets - 1))
        others.append((prefix_of, [rng.randrange(100, 10000) for _ in range(length)],
                       SamplingParams(temperature=draw(st.sampled_from([0, 1.0])), max_tokens=draw(st.integers(1, 20)),
                                      ignore_eos=True)))
    picked = draw(st.lists(st.integers(0, 2 * num_targets - 1), min_size=1, max_size=3, unique=True))
    places = [draw(st.integers(0, len(others) + i)) for i in range(len(picked))]
    return others, picked, places


def _run_composition(llm, targets, composition) -> dict[int, tuple]:
    """Runs the drawn batch; {target index (target * 2 + greedy/seeded): its result}."""
    others, picked, places = composition
    prompts = []
    for prefix_of, tokens, params in others:
        head = targets[prefix_of][: len(targets[prefix_of]) * 2 // 3] if prefix_of is not None else []
        prompts.append((None, head + tokens, params))
    for which, place in zip(picked, places):
        prompts.insert(place, (which, targets[which // 2], (GREEDY, SEEDED)[which % 2]))
    results = _results(llm.generate([p for _, p, _ in prompts], [s for _, _, s in prompts], use_tqdm=False))
    return {which: result for (which, _, _), result in zip(prompts, results) if which is not None}


def _check_engine(llm, targets, reference, greedy_only: bool, examples: int):
    # the same compositions every run comes from conftest's "ci" Hypothesis profile
    @settings(max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(compositions(len(targets)))
    def same_as_alone(composition):
        for which, result in _run_composition(llm, targets, composition).items():
            if not (greedy_only and which % 2):
                assert result == reference[which], (which, composition)
    same_as_alone()


@pytest.fixture(scope="module")
def references(models):
    """{(model, dtype): each target alone, on an engine with nothing cached and the default budget}."""
    cache = {}

    def alone(model: str, dtype: str) -> tuple[list[list[int]], list[tuple]]:
        """(the targets, each alone); the last target is one on which n-gram speculation keeps proposals."""
        if (model, dtype) not in cache:
            llm = _llm(models[model], dtype, 2048, False)
            try:
                targets = _targets(seed=len(model))[:2] + [_speculating_target(llm, seed=len(model))]
                cache[model, dtype] = targets, _alone(llm, targets)
            finally:
                llm.shutdown()
        return cache[model, dtype]
    return alone


@pytest.mark.parametrize("engine", list(ENGINES))
@pytest.mark.parametrize("model", ["default", "llama", "qwen3"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_a_request_gets_the_answer_it_gets_alone(models, references, model, engine, dtype):
    targets, reference = references(model, dtype)
    llm = _llm(models[model], dtype, **ENGINES[engine])
    try:
        speculating = "speculation" in engine
        # the default model in float32 takes seconds per batch here: fewer draws
        examples = 3 if (model, dtype) == ("default", "float32") else 6
        _check_engine(llm, targets, reference, greedy_only=speculating, examples=examples)
        # and again, now that the targets' prefixes are cached (where the engine caches)
        again = _alone(llm, targets)
        assert again[::2] == reference[::2] and (speculating or again == reference)
        totals = llm.client.get_stats().totals
        if "preempting" in engine:
            assert totals.num_preemptions > 0
        if speculating:  # proposals were verified, and some kept (the last target repeats itself)
            assert totals.spec_num_draft_tokens > 0 and totals.spec_num_accepted_tokens > 0
    finally:
        llm.shutdown()


@pytest.mark.parametrize("model,dtype", [("default", "bfloat16"), ("llama", "float32")])
def test_the_check_fails_with_the_shape_tuned_kernels(models, model, dtype):
    """--no-batch-invariant: the targets alone, and together in one batch under a budget of 16 (chunked
    prefills; bf16: decodes through the decode kernel, quantized prefill matmuls through dequantized
    panels, or on the amx tier, where the kept blocks' exact integer sums (amx_quant.c, quant_vnni.c) are
    invariant with or without the flag, the model dequantized through oneDNN's matmuls; float32: MKL's
    matmuls and SDPA), differ somewhere."""
    from engine_core.cpu_kernels import table, tiers
    targets = _targets(seed=7)
    exact_sums = table.runs_here("quant_vnni") or table.runs_here("amx_quant")
    extra = {"quantization": "none"} if dtype == "bfloat16" and tiers.at_least("amx") and exact_sums else {}
    engines = [_llm(models[model], dtype, budget, True, batch_invariant=False, **extra) for budget in (2048, 16)]
    try:
        alone = _alone(engines[0], targets)[::2]
        together = _results(engines[1].generate(targets, GREEDY, use_tqdm=False))
    finally:
        for llm in engines:
            llm.shutdown()
    assert alone != together


def test_a_prompt_that_repeats_an_earlier_answer_gets_the_answer_it_gets_alone(models):
    """Multi-turn chat: turn 2's prompt is turn 1's prompt and answer and more. On the amx tier the default model's
    kept-quantized layers compute prompt tokens with the dequantized model's arithmetic on AMX tiles and output
    tokens with exact integer sums (amx_quant.c): turn 2 must then compute the answer's tokens as prompt tokens
    rather than read the K/V turn 1 cached for them, or its result would depend on what ran before it."""
    from engine_core.cpu_kernels import table
    first = _targets(seed=11)[2][:40]  # with its answer's first 11 tokens: a full block of 8 prompt, 8 answer tokens
    llm = _llm(models["default"], "bfloat16", 2048, True)
    try:
        runner = llm.client.core.executor.runner
        assert runner.prompt_arithmetic == table.runs_here("amx_quant")
        assert llm.client.core.kv_cache_manager.key_prompt_rows == runner.prompt_arithmetic
        answer = _results(llm.generate([first], GREEDY, use_tqdm=False))[0][0]
        second = first + list(answer) + _targets(seed=12)[1]
        after_first = _results(llm.generate([second], [GREEDY], use_tqdm=False))
        hits = llm.client.get_stats().totals
    finally:
        llm.shutdown()
    fresh = _llm(models["default"], "bfloat16", 2048, True)
    try:
        alone = _results(fresh.generate([second], [GREEDY], use_tqdm=False))
    finally:
        fresh.shutdown()
    assert after_first == alone
    # turn 1's blocks of prompt tokens only were shared; its block of prompt and answer tokens only without
    # prompt arithmetic
    assert hits.prefix_cache_hits == (32 if runner.prompt_arithmetic else 48)
