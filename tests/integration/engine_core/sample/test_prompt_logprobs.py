"""Prompt logprobs (SamplingParams.prompt_logprobs): each prompt token's logprob given the tokens before it, equal
to transformers' log-softmax over the prompt in float32, whole or in chunks, with or without a prefix-cache hit,
alone or in a batch."""

import pytest
import torch
import transformers

from common.sampling_params import SamplingParams
from frontend.offline.llm import LLM

pytestmark = pytest.mark.integration

ATOL = 1e-4
PROMPT = [int(t) for t in torch.randint(3, 49152, (45,), generator=torch.Generator().manual_seed(7))]
OTHER = [int(t) for t in torch.randint(3, 49152, (30,), generator=torch.Generator().manual_seed(8))]


def reference(path: str, tokens: list[int]) -> torch.Tensor:
    """transformers' logprobs [len(tokens), vocab] at each prompt position."""
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        return torch.log_softmax(hf(torch.tensor([tokens])).logits[0].float(), dim=-1)


def check(output, tokens: list[int], expected: torch.Tensor, top_n: int) -> None:
    scored = output.prompt_logprobs
    assert scored is not None and len(scored) == len(tokens) and scored[0] is None
    for p in range(1, len(tokens)):
        row, entry = expected[p - 1], scored[p]
        token = tokens[p]
        assert entry[token].logprob == pytest.approx(row[token].item(), abs=ATOL), p
        # a random model's distribution is flat: ranks and the top ids are checked up to values within ATOL
        above, near = int((row > row[token] + ATOL).sum()), int(((row - row[token]).abs() <= ATOL).sum())
        assert above < entry[token].rank <= above + near, p
        tops = sorted((lp.rank, tid) for tid, lp in entry.items() if lp.rank <= top_n and (tid != token or top_n))
        assert [rank for rank, _ in tops] == list(range(1, top_n + 1)), p
        nth = row.topk(top_n).values[-1].item() if top_n else 0.0
        for _, tid in tops:
            assert entry[tid].logprob == pytest.approx(row[tid].item(), abs=ATOL)
            assert row[tid].item() >= nth - ATOL
        assert len(entry) == top_n + (token not in {tid for _, tid in tops})


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def model(request, tiny_models):
    path = tiny_models[request.param]
    return path, {"prompt": reference(path, PROMPT), "other": reference(path, OTHER)}


def make_llm(path: str, **kwargs) -> LLM:
    return LLM(path, dtype="float32", kv_cache_memory="16MiB", max_model_len=256, multiprocess=False, **kwargs)


def test_prompt_logprobs_match_transformers_whole_chunked_and_batched(model):
    path, expected = model
    for budget in (None, 16):  # one step, then 16-token chunks (45 tokens: three steps)
        llm = make_llm(path, max_num_batched_tokens=budget)
        try:
            (alone,) = llm.generate([PROMPT], SamplingParams(max_tokens=2, prompt_logprobs=3), use_tqdm=False)
            check(alone, PROMPT, expected["prompt"], 3)
            # in a batch with a request that asks for none and one that asks for the token's logprob only
            plain, zero, again = llm.generate(
                [OTHER, OTHER, PROMPT], [SamplingParams(max_tokens=2), SamplingParams(max_tokens=2, prompt_logprobs=0),
                                         SamplingParams(max_tokens=2, prompt_logprobs=3)], use_tqdm=False)
            assert plain.prompt_logprobs is None
            check(zero, OTHER, expected["other"], 0)
            check(again, PROMPT, expected["prompt"], 3)
            assert [e and {t: lp.logprob for t, lp in e.items()} for e in again.prompt_logprobs] == \
                [e and {t: lp.logprob for t, lp in e.items()} for e in alone.prompt_logprobs]
        finally:
            llm.shutdown()


def test_a_prompt_in_the_prefix_cache_is_computed_again_to_score_it(model):
    path, expected = model
    llm = make_llm(path)
    try:
        llm.generate([PROMPT], SamplingParams(max_tokens=1), use_tqdm=False)  # its blocks now cached
        (scored,) = llm.generate([PROMPT], SamplingParams(max_tokens=1, prompt_logprobs=1), use_tqdm=False)
        assert scored.num_cached_tokens == 0
        check(scored, PROMPT, expected["prompt"], 1)
        (hit,) = llm.generate([PROMPT], SamplingParams(max_tokens=1), use_tqdm=False)
        assert hit.num_cached_tokens > 0  # a request that scores nothing still hits
        # n samples share one prompt: it comes back once, scored once
        (two,) = llm.generate([PROMPT], SamplingParams(max_tokens=2, n=2, prompt_logprobs=1, temperature=1.0,
                                                       seed=3), use_tqdm=False)
        assert len(two.outputs) == 2
        check(two, PROMPT, expected["prompt"], 1)
    finally:
        llm.shutdown()


def test_prompt_dicts_as_vllm_takes_them(tiny_models):
    llm = make_llm(tiny_models["llama"])
    try:
        by_ids, by_list = llm.generate([{"prompt_token_ids": PROMPT}, PROMPT], SamplingParams(max_tokens=3, temperature=0),
                                       use_tqdm=False)
        assert by_ids.outputs[0].token_ids == by_list.outputs[0].token_ids
        (text,) = llm.generate({"prompt": "hello there"}, SamplingParams(max_tokens=1), use_tqdm=False)
        assert text.prompt == "hello there"
        with pytest.raises(ValueError, match="prompt as a dict must hold one key"):
            llm.generate([{"prompt": "x", "prompt_token_ids": [1]}], SamplingParams(max_tokens=1))
    finally:
        llm.shutdown()
