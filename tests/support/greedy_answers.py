"""Greedy answers to compare bit for bit: a request's tokens with the logprob and rank of the sampled and the
top token at each step, for a fixed set of random prompts of mixed lengths."""

import torch

from common.sampling_params import SamplingParams

MAX_TOKENS = 12


def _ids(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 49152, (n,), generator=g).tolist()


PROMPTS = [_ids(n, seed) for seed, n in enumerate((37, 5, 20, 64, 1, 33, 17, 48))]


def greedy_answers(llm, prompts):
    """(tokens, per token {token id: (logprob, rank)} for the sampled and the top-1 token) of each prompt."""
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, logprobs=1, ignore_eos=True)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    answers = []
    for out in outputs:
        completion = out.outputs[0]
        logprobs = [{t: (lp.logprob, lp.rank) for t, lp in entry.items()} for entry in completion.logprobs]
        answers.append((list(completion.token_ids), logprobs))
    return answers
